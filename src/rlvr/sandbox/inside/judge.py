"""The judge's side of the exchange: the program's objects as `Remote` stand-ins, and what the program may ask of
the judge's own objects.

A `Remote` calls, reads attributes and items, iterates and converts through the program; its truth value,
equality, order and hash are never the program's to decide: equality and hash are identity, order is refused,
and truth is Python's default rule (True, or `len() != 0` for a class with `__len__`; refused for a class that
defines `__bool__`). Membership (`x in obj`) is decided here on the values its iteration gives. The program's
values arrive as the judge's own objects of standard types (`wire`); its exceptions are raised here as the
builtin or standard class, or as a class rebuilt with its bases, so `except ValueError` and
`assertRaises(ProgramError)` catch what they would in one process.

The judge's objects the program was given (a test's lambda, a mock, an instance of a test's class) are served
with a narrower set of operations: calling, items, iteration, conversions, and attributes whose names do not
start with "_" and do not reach frames or code; modules, frames, code, tracebacks and the judge's own machinery
never cross.
"""

import builtins
import os
import signal
import sys
import types

from . import codec, decode, wire

ITEMS_CAP = 1_000_000  # items one iterator of the program's may give the judge
_NEVER_ATTRS = frozenset({"gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "cr_origin",
                          "ag_frame", "ag_code", "ag_await", "tb_frame", "tb_next", "f_globals", "f_locals",
                          "f_builtins", "f_back", "f_code", "func_globals", "im_func", "im_self"})
_REFUSED_TYPES = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType, types.CellType)
# names a test runner reads from a test module to decide what runs: never the program's
RUNNER_NAMES = frozenset({"load_tests", "setUpModule", "tearDownModule", "setup_module", "teardown_module",
                          "setup_function", "teardown_function", "pytest_plugins", "pytestmark", "collect_ignore",
                          "collect_ignore_glob", "__test__", "check"})


def runner_name(name: str) -> bool:
    return name in RUNNER_NAMES or name.startswith(("test", "Test", "pytest_"))


def _refuse(obj) -> str | None:
    if isinstance(obj, _REFUSED_TYPES):
        return f"a {type(obj).__name__} cannot be passed to the program"
    if getattr(builtins, getattr(obj, "__name__", ""), None) is obj and callable(obj):  # eval, exec, open, vars...
        return f"the builtin {obj.__name__} cannot be passed to the program"
    module = getattr(type(obj), "__module__", "") or ""
    if module.split(".")[0] in ("inside", "rlvr"):
        return f"the judge's own {type(obj).__name__} cannot be passed to the program"
    return None


class Remote:
    """One of the program's objects, in the judge."""

    __slots__ = ("_judge", "_n", "_type", "_flags", "_items", "__weakref__")

    def __init__(self, judge, n: int, kind: str, flags: str):
        for name, value in (("_judge", judge), ("_n", n), ("_type", kind), ("_flags", flags), ("_items", 0)):
            object.__setattr__(self, name, value)

    def __call__(self, *args, **kwargs):
        return self._judge.call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith(("__", "_pytest", "_rlvr")):
            raise AttributeError(name)
        return self._judge.ask(self, "getattr", name=name)

    def __setattr__(self, name, value):
        self._judge.ask(self, "setattr", name=name, value=self._judge.arg(value))

    def __delattr__(self, name):
        self._judge.ask(self, "delattr", name=name)

    def __getitem__(self, key):
        return self._judge.ask(self, "getitem", key=self._judge.arg(key))

    def __setitem__(self, key, value):
        self._judge.ask(self, "setitem", key=self._judge.arg(key), value=self._judge.arg(value))

    def __delitem__(self, key):
        self._judge.ask(self, "delitem", key=self._judge.arg(key))

    def __len__(self):
        return _exact(self._judge.ask(self, "len"), int, "len()")

    def __iter__(self):
        return self._judge.ask(self, "iter")

    def __next__(self):
        count = self._items + 1
        if count > ITEMS_CAP:
            raise RuntimeError(f"an iterator of the program's gave more than {ITEMS_CAP} items")
        object.__setattr__(self, "_items", count)
        return self._judge.ask(self, "next")

    def __contains__(self, item):
        # decided here by Python's own rule (identity or ==) on the values the program's iteration gives
        return any(x is item or x == item for x in self)

    def __str__(self):
        return _exact(self._judge.ask(self, "str"), str, "str()")

    def __int__(self):
        return _exact(self._judge.ask(self, "int"), int, "int()")

    def __float__(self):
        return _exact(self._judge.ask(self, "float"), float, "float()")

    def __repr__(self):
        return f"<the program's {self._type} object>"

    def __instancecheck__(self, obj):
        # `isinstance(x, Stack)` with the program's class: the program's own type system answers, as in one process
        return _exact(self._judge.ask(self, "isinstance", other=self._judge.arg(obj)), bool, "isinstance()")

    def __subclasscheck__(self, cls):
        return _exact(self._judge.ask(self, "issubclass", other=self._judge.arg(cls)), bool, "issubclass()")

    def __bool__(self):
        if "b" in self._flags:
            raise TypeError("the truth value of a program object with __bool__ is not decided by the program")
        return "l" not in self._flags or len(self) != 0

    def __reduce__(self):
        raise TypeError("an object of the program's cannot be pickled (it lives in the program's process)")

    __hash__ = object.__hash__


def _exact(value, kind, what):
    if type(value) is not kind or (kind is int and value < 0 and what == "len()"):
        raise TypeError(f"{what} of a program object must give a{' non-negative' if what == 'len()' else ''} "
                        f"{kind.__name__}")
    return value


class ProgramModule(types.ModuleType):
    """The module the tests import the program as (`solution`): setting or deleting one of its names (mock.patch,
    monkeypatch) sets it in the program's own module too."""

    def __setattr__(self, name, value):
        judge = self.__dict__.get("_rlvr_judge")
        if judge is not None and not name.startswith("__") and judge.module_n:
            judge.ask_n(judge.module_n, "setattr", name=name, value=judge.arg(value))
        super().__setattr__(name, value)

    def __delattr__(self, name):
        judge = self.__dict__.get("_rlvr_judge")
        if judge is not None and not name.startswith("__") and judge.module_n:
            judge.ask_n(judge.module_n, "delattr", name=name)
        super().__delattr__(name)


class Judge:
    def __init__(self, pipe: wire.Pipe, child: int):
        self.child, self.killed, self.module_n = child, False, 0
        self.codec = codec.Codec("j", lambda n, kind, flags: Remote(self, n, kind, flags), _refuse)
        self.peer = wire.Peer(pipe, self.serve, self._failed)
        self.uncrossable: list[str] = []  # what could not cross, named in the verdict
        self.patches = None  # rlvr's patch tracker (harness), synced before each request once dirty

    def _failed(self, why: str):
        if why != "its process ended":  # it broke the protocol: stop it
            self.killed = True
            try:
                os.kill(self.child, signal.SIGKILL)
            except OSError:
                pass

    @property
    def gone(self):
        return self.peer.gone

    # ------------------------------------------------------------------------------------ asking the program

    def arg(self, value) -> dict:
        try:
            return {"n": self.codec.encode(value, wire.Memo())}
        except wire.Uncrossable as err:
            self.uncrossable.append(str(err))
            raise

    def ask(self, remote: Remote, op: str, **fields):
        return self.ask_n(remote._n, op, **fields)

    def ask_n(self, n: int, op: str, **fields):
        return self.exchange({"op": op, "t": n, **fields}, wire.Memo())

    def call(self, remote: Remote, args, kwargs):
        memo = wire.Memo()
        try:
            message = {"op": "call", "t": remote._n, "a": [self.codec.encode(a, memo) for a in args],
                       "k": {str(k): self.codec.encode(v, memo) for k, v in kwargs.items()}}
        except wire.Uncrossable as err:
            self.uncrossable.append(str(err))
            raise
        return self.exchange(message, memo)

    def exchange(self, message: dict, memo: wire.Memo):
        if self.patches is not None and self.peer.gone is None:
            self.patches.sync(self)
        reply = self.peer.request(message)
        return self.result(reply, memo)

    def result(self, reply: dict, memo: wire.Memo):
        self.echo(reply)
        try:
            if "w" in reply:
                self.codec.apply(reply["w"], memo)
            if "e" not in reply:
                return self.codec.decode(reply.get("v"), memo)
            error = self.codec.decode(reply["e"], memo)
        except wire.Malformed as err:
            self.peer.fail(f"an undecodable value ({err})")
        if not isinstance(error, BaseException):
            self.peer.fail("a malformed reply")
        raise error

    def echo(self, reply: dict):
        """What the program printed, warned and logged while it served a request, repeated here: written where
        this process's prints go now, warned and logged through this process's filters and handlers."""
        for key, stream in (("o", "stdout"), ("x", "stderr")):
            text = reply.get(key)
            if type(text) is str and text:
                try:
                    getattr(sys, stream).write(text)
                except Exception:
                    pass
        for entry in reply.get("wn", [])[:100] if isinstance(reply.get("wn"), list) else []:
            try:
                category = self.codec.exception_class_of(entry[0])
                if issubclass(category, Warning):
                    import warnings

                    warnings.warn_explicit(str(entry[1]), category, str(entry[2]), int(entry[3]))
            except (wire.Malformed, TypeError, ValueError, IndexError):
                pass
        for entry in reply.get("lg", [])[:1000] if isinstance(reply.get("lg"), list) else []:
            try:
                import logging

                logging.getLogger(str(entry[0])).log(int(entry[1]), "%s", str(entry[2]))
            except (TypeError, ValueError, IndexError):
                pass

    # ------------------------------------------------------------------------------------ the program asking

    def serve(self, request: dict) -> dict:
        memo = wire.Memo()
        try:
            value = self._serve(request, memo)
            changes = self.codec.changes(memo) if request.get("op") == "call" else []
            reply = {"v": self.codec.encode(value, memo)}
            if changes:
                reply["w"] = changes
            return reply
        except wire.Gone:
            raise
        except wire.Uncrossable as err:
            self.uncrossable.append(str(err))
            return {"e": self.codec.encode(TypeError(str(err)), wire.Memo())}
        except BaseException as err:
            try:
                return {"e": self.codec.encode(err, wire.Memo())}
            except BaseException:
                return {"e": self.codec.encode(RuntimeError(type(err).__name__), wire.Memo())}

    def _serve(self, request: dict, memo: wire.Memo):
        op = request.get("op")
        read = self.codec.decode
        if op == "input":
            self.echo(request)
            return builtins.input(read(request.get("prompt"), memo))
        if op == "stdin":
            method, size = request.get("m"), request.get("size", -1)
            if method not in ("read", "readline", "readlines") or type(size) is not int:
                raise TypeError("stdin: read, readline or readlines")
            return getattr(sys.stdin, method)(size)
        n = request.get("t")
        if type(n) is not int or not 0 < n < len(self.codec.exported):
            raise TypeError("no such object of the tests'")
        target = self.codec.exported[n]
        if op == "call":
            args = [read(a, memo) for a in request.get("a", [])]
            kwargs = {str(k): read(v, memo) for k, v in dict(request.get("k", {})).items()}
            self.codec.note_states(memo)
            return target(*args, **kwargs)
        if op in ("getattr", "setattr", "delattr"):
            name = str(request.get("name"))
            if name.startswith("_") or name in _NEVER_ATTRS:
                raise AttributeError(f"the program may not reach {name!r} of the tests' objects")
            if op == "getattr":
                return getattr(target, name)
            if op == "setattr":
                return setattr(target, name, read(request["value"]["n"], memo))
            return delattr(target, name)
        if op == "getitem":
            return target[read(request["key"]["n"], memo)]
        if op == "setitem":
            target[read(request["key"]["n"], memo)] = read(request["value"]["n"], memo)
            return None
        if op == "delitem":
            del target[read(request["key"]["n"], memo)]
            return None
        if op == "eq":
            return bool(target == read(request["other"]["n"], memo))
        if op == "contains":
            return bool(read(request["item"]["n"], memo) in target)
        simple = {"len": len, "iter": iter, "next": next, "bool": bool, "str": str, "repr": repr, "hash": hash}
        if op in simple:
            return simple[op](target)
        raise TypeError(f"unknown request {str(op)[:40]!r}")


# ----------------------------------------------------------------------------------------------------
# The namespace the tests run in.


def reserved(name: str, module: str) -> bool:
    """Names no program object is bound under, whatever the program defines: a builtin's (`len`, `abs`), a
    standard module's (`math`: tests that rely on the solution's `import math` get the real one), the program
    module's own, dunder names, and the names test runners read (`test_*`, `setUpModule`, `load_tests`)."""
    return (hasattr(builtins, name) or name in sys.stdlib_module_names or name == module or name.startswith("__")
            or not name.isidentifier() or runner_name(name))


def program_module(judge: Judge, loaded: dict, module: str) -> tuple[ProgramModule, dict]:
    """The program's module as the tests import it, and every top-level name of the program as the judge holds
    it (reserved or not): its functions and objects as Remotes, its values as values, a standard module it
    imported as the judge's own import of that module."""
    solution = ProgramModule(module)
    program: dict = {}
    for entry in loaded.get("names", [])[:1000] if isinstance(loaded.get("names"), list) else []:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
            continue
        name, kind, node = entry
        if not name.isidentifier() or name.startswith("__"):
            continue
        if kind == "module":
            wanted = str(node)
            if wanted.split(".")[0] not in sys.stdlib_module_names or wanted.split(".")[0] in decode.NO_IMPORT:
                continue
            try:
                __import__(wanted)
                value = sys.modules[wanted]
            except BaseException:
                continue
        else:
            try:
                value = judge.codec.decode(node, wire.Memo())
            except wire.Malformed:
                continue
        program[name] = value
        if not reserved(name, module):
            types.ModuleType.__setattr__(solution, name, value)
    n = loaded.get("self")
    judge.module_n = n if type(n) is int and 0 < n else 0
    types.ModuleType.__setattr__(solution, "_rlvr_judge", judge)
    sys.modules[module] = solution
    return solution, program


def bind(namespace: dict, solution: ProgramModule, program: dict, module: str, entry_point=None, modules=(),
         test_names=(), asked=()):
    """The test file's names before its first statement: the program's unreserved names; not those the file binds
    itself (`test_names`), nor, through `from solution import *`, unless the file asks for one by name (`asked`);
    the standard modules the file reads without importing them; the task's entry point, whatever its name."""
    for name, value in vars(solution).items():
        if not name.startswith("__") and name != "_rlvr_judge":
            namespace.setdefault(name, value)
    namespace[module] = solution
    for name in test_names:
        if name != module:
            namespace.pop(name, None)
            if name not in asked:
                solution.__dict__.pop(name, None)
    for name in modules:
        if name.split(".")[0] in sys.stdlib_module_names and name not in decode.NO_IMPORT:
            try:
                namespace[name] = __import__(name)
            except BaseException:
                pass
    if entry_point is not None:
        if entry_point not in program:
            raise NameError(f"the program defines no {entry_point}")
        namespace[entry_point] = program[entry_point]
        types.ModuleType.__setattr__(solution, entry_point, program[entry_point])
