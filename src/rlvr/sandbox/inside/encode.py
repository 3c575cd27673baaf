"""Encoding a value into `codec`'s nodes: data of the types the codec rebuilds, a handle for anything else."""

import builtins
import collections
import sys

from .wire import Memo, Uncrossable

MAX_DEPTH = 200
MAX_NODES = 2_000_000
BIG = 1 << 63
OVERRIDES = frozenset({"__eq__", "__ne__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
                        "__iter__", "__contains__", "__getitem__", "__str__", "__repr__", "__int__", "__index__",
                        "__float__", "__format__"})
BASES = (list, tuple, dict, set, frozenset, int, float, str, bytes)
BUILTIN_TYPES = (str, bytes, list, dict, set, tuple, int, float, frozenset, bytearray, complex)
VIEWS = {type({}.keys()): "dk", type({}.values()): "dv", type({}.items()): "di"}
# builtins that never cross by name (a handle instead: calling them runs them where they are)
NOT_BY_NAME = frozenset({"exec", "eval", "compile", "open", "breakpoint", "input", "help", "globals", "locals", "vars",
                          "exit", "quit", "__import__", "__build_class__"})


def _plain_base(kind: type):
    """The builtin base a subclass crosses as, or None: only when no class of its own between them redefines
    how it compares, converts or holds items."""
    for base in BASES:
        if issubclass(kind, base):
            for cls in kind.__mro__:
                if cls is base:
                    return base
                if cls.__module__ in sys.stdlib_module_names or OVERRIDES & cls.__dict__.keys():
                    return None
    return None


def _namedtuple_fields(kind: type):
    fields = getattr(kind, "_fields", None)
    if issubclass(kind, tuple) and type(fields) is tuple and all(type(f) is str for f in fields):
        return fields
    return None


def _builtin_name(value) -> str | None:
    name = getattr(value, "__name__", None)
    if type(name) is not str:
        return None
    if getattr(builtins, name, None) is value and not isinstance(value, type(builtins)):
        return None if name in NOT_BY_NAME else name
    owner = getattr(value, "__objclass__", None)
    if owner in BUILTIN_TYPES and getattr(owner, name, None) is value:
        return f"{owner.__name__}.{name}"
    return None


def _found(module: str, qualname: str):
    """What `module.qualname` names where the module is already imported (a class that says it is a standard
    module's, as pytest's outcomes say they are builtins, may not be)."""
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def defines(kind: type, name: str) -> bool:
    """Whether a class of `kind`'s own (not `object`) defines the method `name`."""
    return any(name in vars(cls) for cls in kind.__mro__[:-1])


def _flags(value) -> str:
    kind = type(value)
    return ("c" if callable(value) else "") + "".join(
        flag for flag, name in (("i", "__next__"), ("b", "__bool__"), ("l", "__len__"), ("e", "__eq__"))
        if defines(kind, name))



class Encoder:
    """Encoding, for `codec.Codec` (which sets the attributes it reads)."""

    def export(self, obj) -> int:
        n = self.export_ids.get(id(obj))
        if n is None:
            self.exported.append(obj)
            n = self.export_ids[id(obj)] = len(self.exported) - 1
        return n

    def encode(self, value, memo: Memo, depth: int = 0):
        kind = type(value)
        if kind is str or kind is bool or value is None or kind is float:
            return value
        if kind is int:
            return value if -BIG < value < BIG else ["i", hex(value)]
        if depth > MAX_DEPTH:
            raise Uncrossable("a value nested too deep")
        seen = memo.ids.get(id(value))
        if seen is not None and value is not memo.root and memo.objects.get(seen) is value:
            return ["@", seen]
        if kind is list:
            n = memo.add(value)
            return ["l", n, *[self.encode(v, memo, depth + 1) for v in value]]
        if kind is tuple:
            return ["t", *[self.encode(v, memo, depth + 1) for v in value]]
        if kind is dict:
            return ["d", memo.add(value), *self._pairs(value, memo, depth)]
        if kind is set:
            return ["s", memo.add(value), *[self.encode(v, memo, depth + 1) for v in value]]
        if kind is frozenset:
            return ["f", *[self.encode(v, memo, depth + 1) for v in value]]
        if kind is bytes:
            return ["b", value.decode("latin-1")]
        if kind is complex:
            return ["c", value.real, value.imag]
        if kind is bytearray:
            return ["ba", memo.add(value), value.decode("latin-1")]
        if kind is range:
            return ["r", value.start, value.stop, value.step]
        if kind is collections.Counter:
            return ["ct", memo.add(value), *self._pairs(value, memo, depth)]
        if kind is collections.OrderedDict:
            return ["od", memo.add(value), *self._pairs(value, memo, depth)]
        if kind is collections.defaultdict:
            n = memo.add(value)
            factory = None if value.default_factory is None else self.encode(value.default_factory, memo, depth + 1)
            return ["dd", n, factory, *self._pairs(value, memo, depth)]
        if kind is collections.deque:
            n = memo.add(value)
            return ["q", n, value.maxlen, *[self.encode(v, memo, depth + 1) for v in value]]
        if kind in VIEWS:
            return [VIEWS[kind], self.encode(dict(value.mapping), memo, depth + 1)]
        module = getattr(kind, "__module__", "")
        if module == "fractions" and kind is getattr(sys.modules.get("fractions"), "Fraction", None):
            return ["fr", self.encode(value.numerator, memo), self.encode(value.denominator, memo)]
        if module == "decimal" and kind is getattr(sys.modules.get("decimal"), "Decimal", None):
            return ["de", str(value)]
        n = self.standing.get(id(value))  # the other side's own object, given back
        if n is not None:
            return [self.other, n]
        if isinstance(value, BaseException):
            return self._exception(value, memo, depth)
        if isinstance(value, type):
            n = self.rebuilt_ids.get(id(value))
            if n is not None:
                return [self.other, n]
            if issubclass(value, BaseException):
                return self.exception_class(value)
        fields = _namedtuple_fields(kind)
        if fields is not None:
            return ["nt", kind.__name__, list(fields), *[self.encode(v, memo, depth + 1) for v in value]]
        base = _plain_base(kind) if isinstance(value, BASES) else None
        if base is not None:
            return self.encode(base(value), memo, depth)
        name = _builtin_name(value)
        if name is not None:
            return ["B", name]
        if isinstance(value, type) and value.__bases__ == (tuple,) and _namedtuple_fields(value) is not None \
                and hasattr(value, "_make"):
            return ["NT", value.__name__, list(value._fields)]
        why = self.refuse(value)
        if why:
            raise Uncrossable(why)
        return [self.me, self.export(value), kind.__name__[:60], _flags(value)]

    def _pairs(self, mapping, memo, depth) -> list:
        out = []
        for k, v in mapping.items():
            out.append(self.encode(k, memo, depth + 1))
            out.append(self.encode(v, memo, depth + 1))
        return out

    def exception_class(self, cls: type):
        """A class node: a builtin's name, a standard module's class, or this side's own with its bases."""
        if getattr(builtins, cls.__name__, None) is cls:
            return ["X", "b", cls.__name__]
        module = str(getattr(cls, "__module__", ""))
        if module.split(".")[0] in sys.stdlib_module_names and _found(module, cls.__qualname__) is cls:
            return ["X", "s", module, cls.__qualname__]
        n = self.rebuilt_ids.get(id(cls))
        if n is not None:
            return ["X", self.other, n]
        bases = [self.exception_class(b) for b in cls.__bases__ if isinstance(b, type) and issubclass(b, BaseException)]
        return ["X", self.me, self.export(cls), cls.__name__[:100], cls.__qualname__[:200], module[:100], bases]

    def _exception(self, exc: BaseException, memo, depth):
        attrs = {}
        for name, value in list(getattr(exc, "__dict__", {}).items())[:20]:
            if type(name) is str and not name.startswith("_"):
                try:
                    attrs[name] = self.encode(value, memo, depth + 1)
                except Uncrossable:
                    pass
        try:
            args = [self.encode(a, memo, depth + 1) for a in exc.args]
        except Uncrossable:
            args = [str(a)[:1000] for a in exc.args]
        try:
            text = str(exc)[:2000]
        except Exception:
            text = ""
        return ["x", self.exception_class(type(exc)), args, attrs, text]

    # ---------------------------------------------------------------------------------------- decoding
