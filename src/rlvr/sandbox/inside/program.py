"""The program's process: untrusted from the moment the program's first line runs.

It holds the program and nothing of the judge's (forked before the judge reads its job). It loads the program
as the module the tests import (`solution`), tells the judge its top-level names, then answers the judge's
requests (call, getattr, len, next, ...) until told to stop. The program reaches the tests' world only through
`JudgeObject` stand-ins: the judge's callables and objects it was given (a test's lambda, a mock), `input()` and
`sys.stdin`, which read what the test set up in the judge (monkeypatch, a StringIO), and `sys.stdout` /
`sys.stderr`, whose text goes to the judge's own (so capsys sees it) with each reply. A stdin/stdout task runs
the program as a script, once per input, in a child of this process.
"""

import builtins
import os
import resource
import signal
import sys
import types

from . import codec, scripts, standins, wire
from .standins import Forward, JudgeObject, JudgeStdin, input_of_the_judge



class Server:
    """The program's side of the exchange."""

    def __init__(self, pipe: wire.Pipe, limits: dict):
        self.pid = os.getpid()
        self.codec = codec.Codec("p", JudgeObject)
        self.peer = wire.Peer(pipe, self.serve)
        cap = int(limits.get("output_kb", 1024)) * 1024
        self.out, self.err = Forward(1, cap), Forward(2, cap)
        self.module = None
        self.originals: dict[tuple, object] = {}  # (module, name) -> the program's own value, before a patch
        self.warned: list = []
        self.logged: list = []

    # ----------------------------------------------------------------------------- what the program asks

    def arg(self, value) -> dict:
        return {"n": self.codec.encode(value, wire.Memo())}

    def _exchange(self, message: dict):
        if os.getpid() != self.pid:
            raise RuntimeError("the tests' objects can be used only from the program's own process")
        reply = self.peer.request(message)
        return self.result(reply, wire.Memo())

    def result(self, reply: dict, memo: wire.Memo):
        try:
            if "w" in reply:
                self.codec.apply(reply["w"], memo)
            if "e" in reply:
                error = self.codec.decode(reply["e"], memo)
            else:
                return self.codec.decode(reply.get("v"), memo)
        except wire.Malformed as err:
            raise RuntimeError(f"a malformed reply from the judge ({err})") from None
        if not isinstance(error, BaseException):
            raise RuntimeError("a malformed reply from the judge")
        raise error

    def ask(self, target: JudgeObject, op: str, **fields):
        return self._exchange({"op": op, "t": target._rlvr_n, **fields})

    def ask_call(self, target: JudgeObject, args, kwargs):
        if os.getpid() != self.pid:
            raise RuntimeError("the tests' objects can be used only from the program's own process")
        memo = wire.Memo()
        message = {"op": "call", "t": target._rlvr_n, "a": [self.codec.encode(a, memo) for a in args],
                   "k": {str(k): self.codec.encode(v, memo) for k, v in kwargs.items()}}
        return self.result(self.peer.request(message), memo)

    def ask_stdin(self, method: str, size: int):
        return self._exchange({"op": "stdin", "m": method, "size": size})

    def ask_input(self, prompt):
        text = self.out.take()  # what the program printed before: ahead of the prompt
        return self._exchange({"op": "input", "prompt": self.codec.encode(str(prompt), wire.Memo()), "o": text})

    # ----------------------------------------------------------------------------- what the judge asks

    def serve(self, request: dict) -> dict:
        try:
            reply = self._serve(request)
        except wire.Gone:
            raise
        except BaseException as err:  # the program's exception, as data
            try:
                reply = {"e": self.codec.encode(err, wire.Memo())}
            except BaseException:
                reply = {"e": ["x", ["X", "b", "RuntimeError"], ["an exception that cannot cross"], {}, ""]}
        return self.attach(reply)

    def attach(self, reply: dict) -> dict:
        """What the program printed, warned and logged since the last reply, for the judge to repeat."""
        text, errors = self.out.take(), self.err.take()
        if text:
            reply["o"] = text
        if errors:
            reply["x"] = errors
        if self.warned:
            reply["wn"], self.warned = self.warned[:100], []
        if self.logged:
            reply["lg"], self.logged = self.logged[:1000], []
        return reply

    def forward(self, what: list):
        """Warnings and log records go to the judge, whose filters and handlers (pytest.warns, caplog,
        assertLogs) decide what becomes of them: here every one is kept."""
        if "warnings" in what:
            import warnings

            def show(message, category, filename, lineno, file=None, line=None):
                try:
                    self.warned.append([self.codec.exception_class(category), str(message)[:2000], str(filename)[:200],
                                        int(lineno)])
                except BaseException:
                    pass

            warnings.simplefilter("always")
            warnings.showwarning = show
        if "logging" in what:
            import logging

            server = self

            class Forward(logging.Handler):
                def emit(self, record):
                    if os.getpid() == server.pid:
                        server.logged.append([record.name[:200], int(record.levelno), record.getMessage()[:2000]])

            logging.root.addHandler(Forward())
            logging.root.setLevel(1)

    def _serve(self, request: dict) -> dict:
        op, memo = request.get("op"), wire.Memo()
        if op == "script":
            ran = scripts.run_script(self.code, str(request.get("stdin", "")), int(request.get("cap", 1 << 20)))
            return {"v": self.codec.encode(ran, memo)}
        if op == "sync":
            self.sync(request.get("patches") or [])
            env = request.get("env")
            if isinstance(env, dict):
                for key, value in dict(env.get("set") or {}).items():
                    os.environ[str(key)] = str(value)
                for key in list(env.get("unset") or []):
                    os.environ.pop(str(key), None)
            if isinstance(request.get("cwd"), str):
                os.chdir(request["cwd"])
            return {"v": None}
        n = request.get("t")
        if type(n) is not int or not 0 < n < len(self.codec.exported):
            raise TypeError("no such object")
        target = self.codec.exported[n]
        read = self.codec.decode
        if op == "call":
            args = [read(a, memo) for a in request.get("a", [])]
            kwargs = {str(k): read(v, memo) for k, v in dict(request.get("k", {})).items()}
            self.codec.note_states(memo)
            value = target(*args, **kwargs)
            changes = self.codec.changes(memo)
            return {"w": changes, "v": self.codec.encode(value, memo)} if changes else {"v": self.codec.encode(value, memo)}
        if op == "getattr":
            return {"v": self.codec.encode(getattr(target, str(request["name"])), memo)}
        if op == "setattr":
            setattr(target, str(request["name"]), read(request["value"]["n"], memo))
            return {"v": None}
        if op == "delattr":
            delattr(target, str(request["name"]))
            return {"v": None}
        if op == "getitem":
            return {"v": self.codec.encode(target[read(request["key"]["n"], memo)], memo)}
        if op == "setitem":
            target[read(request["key"]["n"], memo)] = read(request["value"]["n"], memo)
            return {"v": None}
        if op == "delitem":
            del target[read(request["key"]["n"], memo)]
            return {"v": None}
        if op in ("isinstance", "issubclass"):
            other = read(request["other"]["n"], memo)
            return {"v": isinstance(other, target) if op == "isinstance" else issubclass(other, target)}
        simple = {"len": len, "iter": iter, "next": next, "str": str, "repr": repr, "int": int, "float": float,
                  "index": _index, "bool": bool}
        if op in simple:
            return {"v": self.codec.encode(simple[op](target), memo)}
        raise TypeError(f"unknown request {str(op)[:40]!r}")

    def sync(self, patches):
        """The tests patched standard modules (mock.patch, monkeypatch): the same names here, as stand-ins for
        the judge's objects; None puts the program's own value back."""
        for module_name, name, node in patches[:1000]:
            module = sys.modules.get(str(module_name))
            if module is None or not isinstance(name, str):
                continue
            key = (module.__name__, name)
            if node is None:
                if key in self.originals:
                    original = self.originals.pop(key)
                    if original is _MISSING:
                        module.__dict__.pop(name, None)
                    else:
                        setattr(module, name, original)
                continue
            self.originals.setdefault(key, module.__dict__.get(name, _MISSING))
            if node == "-":
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, self.codec.decode(node, wire.Memo()))

    # ----------------------------------------------------------------------------- loading

    def load(self, job: dict) -> dict:
        try:
            self.code = compile(job["program"], scripts.SCRIPT_NAME, "exec")
        except BaseException as err:  # SyntaxError, or a MemoryError from a huge program
            return {"load": "syntax_error", "error": type(err).__name__}
        if job.get("runner") == "stdio":
            return {"load": "ok", "names": []}
        module = types.ModuleType(job["module"])
        module.__file__ = scripts.SCRIPT_NAME
        sys.modules[job["module"]] = module
        try:
            exec(self.code, module.__dict__)
        except BaseException as err:  # SystemExit too: exiting before the tests run is not passing them
            return {"load": "error", "error": type(err).__name__}
        self.module = module
        names = []
        for name, value in list(module.__dict__.items())[:1000]:
            if name.startswith("__"):
                continue
            if isinstance(value, types.ModuleType):
                names.append([name, "module", value.__name__])
                continue
            try:
                names.append([name, "value", self.codec.encode(value, wire.Memo())])
            except BaseException:
                names.append([name, "value", [self.codec.me, self.codec.export(value), "object", ""]])
        return {"load": "ok", "names": names, "self": self.codec.export(module)}


_MISSING = object()


def _index(value):
    return value.__index__()


def limit(limits: dict):
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.get("files", 64),) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["tasks"],) * 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with an error instead


def main(pipe: wire.Pipe):
    """Serve the judge until it stops; never returns."""
    job = pipe.receive()
    if not isinstance(job, dict):
        os._exit(1)
    limit(job["limits"])
    standins.server = server = Server(pipe, job["limits"])
    sys.stdout, sys.stderr, sys.stdin = server.out, server.err, JudgeStdin()
    builtins.input = input_of_the_judge
    server.forward(job.get("forward") or [])
    loaded = server.attach(server.load(job))
    pipe.send(loaded)
    if loaded["load"] != "ok":
        os._exit(0)
    while True:
        with server.peer.lock:
            request = pipe.receive()
        if not isinstance(request, dict):
            os._exit(0)
        reply = server.serve(request)
        with server.peer.lock:
            if not pipe.send(reply):
                os._exit(0)
