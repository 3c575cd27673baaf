"""Inside the sandbox: the judge and the program, two processes joined by two pipes.

    python -S -s -P -B harness.py <result fd> <mode> <uid | ->

Standard library only: it runs inside the sandbox, where no site-packages exist. `rlvr.sandbox` imports this
file too, for the value codec (`encode`, `decode`; its probe reads its own program's values with `decode`). The
trainer never builds a program's value: it compares encode's text with the test's literal on canonical
spellings (`rlvr.grading.values`), since building a value the program chose (a set of colliding hashes) would
cost it time outside every limit. Inside, the judge's own `decode` is bounded by the sandbox's deadline.

The judge is trusted and holds everything that decides a verdict: the tests (read from stdin only after the
program's process has been forked off, so they are never in its memory), the result pipe to rlvr, and the
namespace the test code runs in. The program's process holds only its own pipe pair. The test code calls
the program's functions through `Remote` handles; arguments and results cross the pipes as text of exact
built-in types (`encode` / `decode`), so every value a test compares is the judge's own object, built by the
judge's own parser: a program that patches `assert`, `==`, `json`, `sys.exit` or the harness, returns an
object equal to everything, or writes records to any file descriptor only changes what its own functions
return. Whatever the program writes, the judge reads it with size limits and turns anything unexpected into
an error of that call.

Under bubblewrap the judge is PID 1 of the sandbox's PID namespace: the kernel delivers it no signal from
the program other than those it has a handler for (only SIGALRM, its own deadline), and when it exits every
process left in the namespace dies with it. It is not dumpable, so the program cannot open its /proc files
or memory (ptrace and process_vm_* are refused by seccomp as well). With `limits_only` the two processes
are plain processes of the same user: the program could signal or trace the judge (see rlvr.sandbox).

Steps, in order:
  1. (rlvr started as root) empty the capability bounding set, drop to the sandbox's own uid: no capability
     is left in any set; the parent-death signal is armed again (a uid change clears it).
  2. not dumpable; a deadline (SIGALRM) after which the judge exits whatever the program does
  3. fork: the child becomes the program's process; it closes stdin and the result pipe at once
  4. judge: read the job, send the program and its limits to the child, then run the checks
  5. program: resource limits, load the program, answer the judge's requests until told to stop
"""

import _ast  # the node classes without the ast module's imports (10 ms a sandbox)
import builtins
import ctypes
import json
import keyword
import math
import os
import resource
import select
import signal
import sys
import types

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
LINE_CAP = 4 << 20  # bytes of one message from the program; past it the program is killed
VALUE_CAP = 1_000_000  # characters of one encoded value
MAX_NAMES = 1000
_NO_IMPORT = {"antigravity", "this", "idlelib", "turtle", "turtledemo", "tkinter", "pdb", "webbrowser", "pydoc"}
_EXACT = (int, float, complex, str, bytes, bool, type(None))
# the program's exceptions are raised in the judge as these builtins (by name); any other name as ProgramRaised
SAFE_EXCEPTIONS = {name: cls for name, cls in vars(builtins).items()
                   if isinstance(cls, type) and issubclass(cls, Exception)
                   and not issubclass(cls, (StopIteration, StopAsyncIteration)) and not name.startswith("_")}


# ----------------------------------------------------------------------------------------------------
# Values across the pipes: text of exact built-in types only.


class DecodeError(ValueError):
    pass


def encode(value, depth=0, budget=None):
    """Text for a value built only from exact built-in types (no subclasses: an object whose __eq__ says yes
    to everything cannot cross), or None when it is not one. `decode` reads it back."""
    budget = budget if budget is not None else [100_000]
    budget[0] -= 1
    if budget[0] < 0 or depth > 50:
        return None
    kind = type(value)
    if kind is float and not math.isfinite(value):
        return f"float('{value}')"
    if kind in _EXACT:
        text = repr(value)
        return text if len(text) <= VALUE_CAP else None
    if kind in (list, tuple, set, frozenset):
        parts = [encode(v, depth + 1, budget) for v in value]
        if any(p is None for p in parts):
            return None
        if kind is list:
            return "[" + ", ".join(parts) + "]"
        if kind is tuple:
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        body = ", ".join(sorted(parts))
        if kind is set:
            return "{" + body + "}" if parts else "set()"
        return "frozenset({" + body + "})" if parts else "frozenset()"
    if kind is dict:
        items = [(encode(k, depth + 1, budget), encode(v, depth + 1, budget)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    return None


def decode(text):
    """The value of `encode`'s text, built here: literals, containers, set(), frozenset(...), float('nan'/'inf').
    Raises DecodeError for anything else, however malformed, deep or large."""
    if not isinstance(text, str) or len(text) > VALUE_CAP:
        raise DecodeError("not a value")
    try:
        tree = compile(text, "<value>", "eval", _ast.PyCF_ONLY_AST).body
        return _build(tree, 0)
    except DecodeError:
        raise
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, OverflowError) as err:
        raise DecodeError(type(err).__name__) from None


def _build(node, depth):
    if depth > 60:
        raise DecodeError("too deep")
    if isinstance(node, _ast.Constant) and type(node.value) in _EXACT and node.value is not Ellipsis:
        return node.value
    if isinstance(node, _ast.UnaryOp) and isinstance(node.op, (_ast.USub, _ast.UAdd)):
        value = _build(node.operand, depth + 1)
        if type(value) not in (int, float, complex):
            raise DecodeError("sign of a non-number")
        return -value if isinstance(node.op, _ast.USub) else value
    if isinstance(node, _ast.BinOp) and isinstance(node.op, (_ast.Add, _ast.Sub)):  # complex: (1+2j)
        left, right = _build(node.left, depth + 1), _build(node.right, depth + 1)
        if type(left) not in (int, float) or type(right) is not complex:
            raise DecodeError("not a complex number")
        return left + right if isinstance(node.op, _ast.Add) else left - right
    if isinstance(node, (_ast.List, _ast.Tuple, _ast.Set)):
        items = [_build(e, depth + 1) for e in node.elts]
        return {_ast.List: list, _ast.Tuple: tuple, _ast.Set: set}[type(node)](items)
    if isinstance(node, _ast.Dict):
        if any(k is None for k in node.keys):
            raise DecodeError("** in a dict")
        return {_build(k, depth + 1): _build(v, depth + 1) for k, v in zip(node.keys, node.values)}
    if isinstance(node, _ast.Call) and isinstance(node.func, _ast.Name) and not node.keywords:
        name, args = node.func.id, node.args
        if name == "set" and not args:
            return set()
        if name == "frozenset" and len(args) <= 1:
            return frozenset(_build(args[0], depth + 1)) if args else frozenset()
        if (name == "float" and len(args) == 1 and isinstance(args[0], _ast.Constant)
                and args[0].value in ("nan", "inf", "-inf")):
            return float(args[0].value)
    raise DecodeError(f"not a literal: {type(node).__name__}")


# ----------------------------------------------------------------------------------------------------
# Lines over pipes, read with a cap.


class Pipe:
    """One end of a pipe pair: `send` a JSON line, `receive` one (None at EOF or past the cap)."""

    def __init__(self, read_fd, write_fd, death_fd=None):
        self.read_fd, self.write_fd, self.death_fd, self.buffer = read_fd, write_fd, death_fd, b""
        self.broken = None  # why the last `receive` gave None other than the end of the stream

    def send(self, message) -> bool:
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.write_fd, data):]
            return True
        except OSError:
            return False

    def receive(self):
        while b"\n" not in self.buffer:
            if len(self.buffer) > LINE_CAP:
                self.broken = "a message past the size limit"
                return None
            if self.death_fd is not None:  # the program's process gone: stop waiting for it
                ready, _, _ = select.select([self.read_fd, self.death_fd], [], [])
                if self.read_fd not in ready:
                    return None
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        if len(line) > LINE_CAP:
            self.broken = "a message past the size limit"
            return None
        try:
            return json.loads(line.decode("utf-8"))
        except Exception:  # RecursionError, MemoryError, UnicodeDecodeError, ValueError: not a message
            self.broken = "a message that is not JSON"
            return None


# ----------------------------------------------------------------------------------------------------
# The judge's side.


class ProgramGone(BaseException):
    """The program's process died or broke the protocol: no later call can be answered. A BaseException, so
    that test code's `except Exception` cannot turn it into a pass."""


class ProgramRaised(Exception):
    """The program raised an exception that is not a builtin one (its class name is the message)."""


class Judge:
    def __init__(self, pipe: Pipe, child: int):
        self.pipe, self.child, self.gone, self.killed = pipe, child, None, False

    def ask(self, op: str, target, **fields):
        """One request to the program; its answer as a value of ours, a Remote, or the exception it raised."""
        if self.gone:
            raise ProgramGone(self.gone)
        if not self.pipe.send({"op": op, "t": target, **fields}):
            self._fail("the program's pipe is closed")
        reply = self.pipe.receive()
        if not isinstance(reply, dict):
            self._fail((self.pipe.broken or "the program's process ended") if reply is None else "a malformed reply")
        return self.value(reply)

    def _fail(self, why: str):
        self.gone = why
        if why != "the program's process ended":  # it broke the protocol: stop it
            self.killed = True
            try:
                os.kill(self.child, signal.SIGKILL)
            except OSError:
                pass
        raise ProgramGone(why)

    def value(self, reply: dict):
        if "v" in reply:
            try:
                return decode(reply["v"])
            except DecodeError:
                self._fail("an undecodable value")
        if "h" in reply and type(reply["h"]) is int:
            return Remote(self, reply["h"], str(reply.get("type", "object"))[:80])
        if "e" in reply:  # raised as the first builtin class in its MRO: a ValueError subclass is a ValueError
            name, message = str(reply["e"])[:100], str(reply.get("m", ""))[:500]
            lineage = reply.get("mro") if isinstance(reply.get("mro"), list) else []
            for candidate in [name, *lineage[:20]]:
                cls = SAFE_EXCEPTIONS.get(str(candidate))
                if cls is not None:
                    raise cls(message)
            raise ProgramRaised(name)
        self._fail("a malformed reply")

    def argument(self, value):
        if isinstance(value, Remote) and value._judge is self:
            return {"h": value._id}
        text = encode(value)
        if text is None:
            raise TypeError(f"a {type(value).__name__} cannot be passed to the program (exact built-in values only)")
        return {"v": text}

    def call(self, target: int, args, kwargs):
        packed = [self.argument(a) for a in args]
        named = {str(k): self.argument(v) for k, v in kwargs.items()}
        if self.gone:
            raise ProgramGone(self.gone)
        if not self.pipe.send({"op": "call", "t": target, "a": packed, "k": named}):
            self._fail("the program's pipe is closed")
        reply = self.pipe.receive()
        if not isinstance(reply, dict):
            self._fail((self.pipe.broken or "the program's process ended") if reply is None else "a malformed reply")
        for change in reply.get("w", []) if isinstance(reply.get("w"), list) else []:
            if isinstance(change, list) and len(change) == 2:
                _write_back(args, *change)  # a list, dict or set argument the program changed in place
        return self.value(reply)


def _write_back(args, index, text):
    if not (type(index) is int and 0 <= index < len(args)):
        return
    mine = args[index]
    try:
        new = decode(text)
    except DecodeError:
        return
    if type(mine) is list and type(new) is list:
        mine[:] = new
    elif type(mine) in (dict, set) and type(new) is type(mine):
        mine.clear()
        mine.update(new)


class Remote:
    """A program object in the judge: calls, attributes, items, len, iteration and str go to the program and
    come back as values; its truth value, equality and hash are never the program's to decide (identity
    only), and membership (`x in obj`) is decided here on the values its iteration gives."""

    __slots__ = ("_judge", "_id", "_type")

    def __init__(self, judge: Judge, ident: int, kind: str):
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_type", kind)

    def __call__(self, *args, **kwargs):
        return self._judge.call(self._id, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._judge.ask("getattr", self._id, name=name)

    def __setattr__(self, name, value):
        self._judge.ask("setattr", self._id, name=name, value=self._judge.argument(value))

    def __getitem__(self, key):
        return self._judge.ask("getitem", self._id, key=self._judge.argument(key))

    def __setitem__(self, key, value):
        self._judge.ask("setitem", self._id, key=self._judge.argument(key), value=self._judge.argument(value))

    def __len__(self):
        n = self._judge.ask("len", self._id)
        if type(n) is not int or n < 0:
            raise TypeError("len() of a program object must be a non-negative int")
        return n

    def __iter__(self):
        items = self._judge.ask("iter", self._id)
        if type(items) is not list:
            raise TypeError("iterating a program object must give a list")
        return iter(items)

    def __contains__(self, item):
        # decided here by Python's own rule (identity or ==) on the values the program's iteration gives
        return any(x is item or x == item for x in self)

    def __str__(self):
        text = self._judge.ask("str", self._id)
        if type(text) is not str:
            raise TypeError("str() of a program object must be a str")
        return text

    def __int__(self):
        return _exact(self._judge.ask("int", self._id), int)

    def __float__(self):
        return _exact(self._judge.ask("float", self._id), float)

    def __repr__(self):
        return f"<the program's {self._type} object>"

    def __bool__(self):
        raise TypeError("the truth value of a program object is not decided by the program")

    __hash__ = object.__hash__


def _exact(value, kind):
    if type(value) is not kind:
        raise TypeError(f"expected a {kind.__name__} from the program")
    return value


def _reserved(name: str, module: str) -> bool:
    """Names no program object is bound under, whatever the program defines: a builtin's (`len`, `abs`), a
    standard module's (`math`: tests that rely on the solution's `import math` get the real one), the program
    module's own, and dunder names (the judge's `__rlvr_bind__`, `__builtins__`)."""
    return (hasattr(builtins, name) or name in sys.stdlib_module_names or name == module or name.startswith("__")
            or not name.isidentifier() or keyword.iskeyword(name))


def _bind_names(judge: Judge, names, module: str) -> dict:
    """The test namespace: the program's top-level names but reserved ones (its functions and objects as
    Remotes, its values as values, a module it imported under another name as the judge's own import of it),
    the program's module (`import solution`, `from solution import *`) holding the same names, and
    `__rlvr_bind__`, which the test file calls first (rlvr.grading.code_tests writes that call)."""
    namespace = {"__builtins__": builtins, "__name__": "__main__"}
    solution = types.ModuleType(module)
    program = {}  # every top-level name of the program, reserved or not, as the judge holds it
    for entry in names[:MAX_NAMES] if isinstance(names, list) else []:
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)):
            continue
        name = entry["name"]
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
            continue
        if "module" in entry:  # the judge's own copy of a standard module the program imported
            wanted = str(entry["module"])
            if wanted not in sys.stdlib_module_names or wanted in _NO_IMPORT:
                continue
            try:
                value = __import__(wanted)
            except BaseException:
                continue
        else:
            try:
                value = judge.value(entry)
            except (ProgramGone, Exception):
                continue
        program[name] = value
        if not _reserved(name, module):
            setattr(solution, name, value)
            namespace[name] = value
    sys.modules[module] = solution
    namespace[module] = solution

    def bind(entry_point=None, modules=(), test_names=(), asked=()):
        for name in test_names:  # the file binds these itself: never the program's, even before it does
            if name != module:
                namespace.pop(name, None)
                if name not in asked:  # nor by `from solution import *` after the file bound it
                    solution.__dict__.pop(name, None)
        for name in modules:  # standard modules the file uses without importing them
            if name in sys.stdlib_module_names and name not in _NO_IMPORT:
                try:
                    namespace[name] = __import__(name)
                except BaseException:
                    pass
        if entry_point is not None:  # the task's function is the program's, whatever its name (`max`)
            if entry_point not in program:
                raise NameError(f"the program defines no {entry_point}")
            namespace[entry_point] = program[entry_point]
            setattr(solution, entry_point, program[entry_point])

    namespace["__rlvr_bind__"] = bind
    return namespace


def judge_main(job: dict, results: Pipe, judge: Judge) -> bool:
    """Load the program, bind its names, run every check in order; True when the checks ran.

    As a script runs: a check's setup (the statements before it) that raises stops the file, and that check
    and every later one fail; a failing check does not stop the ones after it. Kind "value" sends its
    expression's value, "true" its truth value; "run" executes statements and passes when they complete."""
    write = results.send
    write({"ready": True})
    if not judge.pipe.send({"program": job["program"], "module": job["module"], "limits": job["limits"]}):
        write({"load": "died"})
        return False
    loaded = judge.pipe.receive()
    if not isinstance(loaded, dict) or loaded.get("load") not in ("ok", "syntax_error", "error"):
        write({"load": "died"})
        if loaded is not None or judge.pipe.broken:  # alive but talking garbage: stop it now
            try:
                judge._fail(judge.pipe.broken or "a malformed reply")
            except ProgramGone:
                pass
        return False
    if loaded["load"] != "ok":
        write({"load": loaded["load"], "error": str(loaded.get("error", ""))[:100]})
        return False
    write({"load": "ok"})
    namespace = _bind_names(judge, loaded.get("names"), job["module"])
    stopped = None  # the exception that stopped the file
    for i, check in enumerate(job["checks"]):
        if stopped is None and check.get("setup"):
            try:
                exec(compile(check["setup"], f"test_{i}.py", "exec"), namespace)
            except BaseException as err:  # ProgramGone too
                stopped = type(err).__name__
        if stopped is not None:
            write({"check": i, "error": stopped})
            continue
        try:
            if check["kind"] == "run":
                exec(compile(check["expr"], f"test_{i}.py", "exec"), namespace)
                record = {"check": i, "value": "True"}
            else:
                value = eval(compile(check["expr"], f"test_{i}.py", "eval"), namespace)
                if check["kind"] == "value":
                    text = encode(value)
                    record = {"check": i, "value": text} if text is not None else {"check": i, "error": "unserializable"}
                else:  # "true": the assert's own rule, truthiness, on a value of the judge's
                    record = {"check": i, "value": "True" if value else "False"}
        except BaseException as err:  # ProgramGone too: this check and every later one fail
            record = {"check": i, "error": type(err).__name__}
        write(record)
    return True


# ----------------------------------------------------------------------------------------------------
# The program's side: untrusted from the moment the program's first line runs.


def program_main(pipe: Pipe):
    job = pipe.receive()
    if not isinstance(job, dict):
        os._exit(1)
    _limit(job["limits"])
    try:
        code = compile(job["program"], "solution.py", "exec")
    except BaseException as err:  # SyntaxError, or a MemoryError from a huge program
        pipe.send({"load": "syntax_error", "error": type(err).__name__})
        os._exit(0)
    module = types.ModuleType(job["module"])
    sys.modules[job["module"]] = module
    try:
        exec(code, module.__dict__)
    except BaseException as err:  # SystemExit too: exiting before the tests run is not passing them
        pipe.send({"load": "error", "error": type(err).__name__})
        os._exit(0)
    objects: list = []
    names = []
    for name, value in list(module.__dict__.items())[:MAX_NAMES]:
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names.append({"name": name, "module": value.__name__})
        else:
            names.append({"name": name, **_reply(value, objects)})
    pipe.send({"load": "ok", "names": names})
    while True:
        request = pipe.receive()
        if not isinstance(request, dict):
            os._exit(0)
        pipe.send(_serve(request, objects))


def _reply(value, objects: list) -> dict:
    text = encode(value)
    if text is not None:
        return {"v": text}
    objects.append(value)
    return {"h": len(objects) - 1, "type": type(value).__name__}


def _serve(request: dict, objects: list) -> dict:
    def arg(packed):
        return objects[packed["h"]] if "h" in packed else decode(packed["v"])

    try:
        target = objects[request["t"]]
        op = request["op"]
        if op == "call":
            args = [arg(a) for a in request["a"]]
            kwargs = {k: arg(v) for k, v in request["k"].items()}
            before = [encode(a) if type(a) in (list, dict, set) else None for a in args]
            result = _reply(target(*args, **kwargs), objects)
            changed = [[i, encode(a)] for i, a in enumerate(args) if before[i] is not None and encode(a) != before[i]]
            if changed:
                result["w"] = changed
            return result
        if op == "getattr":
            return _reply(getattr(target, request["name"]), objects)
        if op == "setattr":
            setattr(target, request["name"], arg(request["value"]))
            return {"v": "None"}
        if op == "getitem":
            return _reply(target[arg(request["key"])], objects)
        if op == "setitem":
            target[arg(request["key"])] = arg(request["value"])
            return {"v": "None"}
        if op == "iter":
            items = [_reply(v, objects) for v in target]
            if all("v" in r for r in items):
                return {"v": "[" + ", ".join(r["v"] for r in items) + "]"}
            return _reply(list(target), objects)  # a list holding objects: a Remote of it
        simple = {"len": len, "str": str, "int": int, "float": float}
        if op in simple:
            return _reply(simple[op](target), objects)
        return {"e": "TypeError", "m": f"unknown request {op!r}"}
    except BaseException as err:
        return {"e": type(err).__name__, "mro": [c.__name__ for c in type(err).__mro__[1:]],
                "m": str(err)[:200] if isinstance(err, Exception) else ""}


def _limit(limits: dict):
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with an error instead


# ----------------------------------------------------------------------------------------------------
# Start-up.


def _drop_to(uid: int):
    """Step 1 (rlvr started as root; bubblewrap gave us only CAP_SETUID, CAP_SETGID and CAP_SETPCAP)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # the uid change emptied the permitted and effective sets; the inheritable one is emptied here (capset)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    libc.capset(header, (ctypes.c_uint32 * 6)())
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}
    if any(int(value, 16) for value in caps.values()) or os.getuid() != uid:
        raise SystemExit(f"the sandbox could not drop its privileges: {caps}")


def main():
    result_fd, mode, uid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if uid != "-":
        _drop_to(int(uid))
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)  # as PID 1 of a namespace, a default action is never taken
    signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
    child_reads, judge_writes = os.pipe()
    judge_reads, child_writes = os.pipe()
    pid = os.fork()
    if pid == 0:  # the program's process: nothing of the judge's stays open
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        for fd in (null, result_fd, judge_reads, judge_writes):
            os.close(fd)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        program_main(Pipe(child_reads, child_writes))
        os._exit(0)
    os.close(child_reads)
    os.close(child_writes)
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    signal.alarm(int(job["deadline"]) + 1)
    judge_limit = (job["limits"]["memory_mb"] + 256) << 20  # room to decode a large value
    resource.setrlimit(resource.RLIMIT_AS, (judge_limit, judge_limit))
    death = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    results = Pipe(-1, result_fd)
    judge = Judge(Pipe(judge_reads, judge_writes, death), pid)
    ran = judge_main(job, results, judge)
    # how the program ended, if it did before the end (a CPU-limit kill is a timeout, not a crash); its pipe
    # closes a moment before it can be waited for
    if death is not None and (judge.gone or not ran):
        select.select([death], [], [], 2.0)
    if judge.gone and judge.killed:
        results.send({"broken": judge.gone})  # the judge's own SIGKILL, not a CPU limit
    ended, status = os.waitpid(pid, os.WNOHANG)
    if ended:
        signaled = os.WIFSIGNALED(status)
        results.send({"exit": os.WTERMSIG(status) if signaled else os.WEXITSTATUS(status), "signaled": signaled})
    if ran:
        results.send({"done": True})
    os._exit(0)


if __name__ == "__main__":
    main()
