"""Values across the sandbox's pipes: a tagged JSON tree that each side rebuilds as standard types.

Both processes inside a sandbox (the judge and the program, `harness`) hold their own objects; what crosses is
data, rebuilt by the receiver's own code from a closed set of types, or a handle that stands for an object the
sender keeps. A node is a JSON value:

    null, true, false, a number, a string      None, bool, int (|x| < 2**63), float (NaN and infinities too), str
    ["i", hex]  a larger int      ["b", latin-1 text] bytes      ["c", re, im] complex
    ["l", id, *items] list        ["t", *items] tuple            ["s", id, *items] set     ["f", *items] frozenset
    ["d", id, k, v, ...] dict     ["od", ...] OrderedDict        ["ct", ...] Counter       ["dd", id, factory, ...]
    ["q", id, maxlen, *items] deque   ["ba", id, text] bytearray ["r", start, stop, step] range
    ["fr", numerator, denominator] Fraction    ["de", text] Decimal    ["dk" | "dv" | "di", dict node] a view
    ["nt", name, [fields], *items] a namedtuple; ["NT", name, [fields]] its class
    ["x", class, [args], {attribute: node}, str] an exception; ["X", ...] an exception class (builtin, standard
        library, or the other side's own, rebuilt here with its bases so that `except` of a base catches it)
    ["B", "len" | "str.lower"] a builtin, by name
    ["@", id]   a container met before in the same exchange: aliases, cycles, and an argument given back
    ["p", n, type, flags] / ["j", n, type, flags]  a handle to an object the program / the judge keeps
                (flags: c callable, i iterator, b defines __bool__, l defines __len__, e defines __eq__)

Ids number the mutable containers of one exchange (a request and its reply share them): the callee of a call
rebuilds the arguments, runs, and sends back the containers it changed (`changes`), at any depth, as their new
contents; the caller writes them into its own objects, so a test's references to nested rows see the change and
aliases stay aliases. Subclasses of builtins cross as their base type only when no class of the program's
between them defines a comparison, conversion or container method (an int that equals everything stays a
handle). Reading is bounded: depth, node count, message size; anything else is `Malformed`.
"""

import collections

from .decode import Decoder
from .encode import MAX_NODES, Encoder
from .wire import Malformed, Memo


class Codec(Encoder, Decoder):
    """One side's encoder and decoder. `me` is "p" (the program) or "j" (the judge); `stand_in(n, type, flags)`
    makes the local stand-in for the other side's object n; `refuse(obj)` says why this side never hands an object
    out (None: it may, as a handle)."""

    def __init__(self, me: str, stand_in, refuse=lambda obj: None):
        self.me, self.other = me, ("j" if me == "p" else "p")
        self.stand_in, self.refuse = stand_in, refuse
        self.exported: list = [None]  # n -> this side's object handed out as a handle
        self.export_ids: dict[int, int] = {}
        self.stand_ins: dict[int, object] = {}  # the other side's n -> our stand-in (one per object: `is` holds)
        self.rebuilt: dict[int, type] = {}  # the other side's n -> the exception or namedtuple class rebuilt here
        self.rebuilt_ids: dict[int, int] = {}  # id(rebuilt class) -> its n
        self.standing: dict[int, int] = {}  # id(stand-in) -> the other side's n
        self.namedtuples: dict[tuple, type] = {}
        self.tamed: dict[int, type] = {}  # a runner-steering class of the other side's -> the plain one here

    # ---------------------------------------------------------------------------------------- encoding


    # ---------------------------------------------------------------------------------------- write-back

    def shallow(self, obj, memo: Memo):
        """A container's contents, its nested containers as references: what `changes` compares."""
        memo.root = obj
        try:
            return self.encode(obj, memo)
        finally:
            memo.root = None

    def changes(self, memo: Memo) -> list:
        """[id, node] for every received container whose contents differ from when it arrived (callee)."""
        out = []
        for n, before in list(memo.states.items()):
            after = self.shallow(memo.objects[n], memo)
            if after != before:
                out.append([n, after])
        return out

    def note_states(self, memo: Memo):
        """Remember every received container's contents (callee, before running)."""
        memo.states = {n: self.shallow(obj, memo) for n, obj in list(memo.objects.items())}

    def apply(self, changes, memo: Memo, budget=None):
        """Write the callee's changes into the caller's own containers (caller)."""
        budget = budget if budget is not None else [MAX_NODES]
        if type(changes) is not list:
            raise Malformed("changes")
        for change in changes[:100_000]:
            if type(change) is not list or len(change) != 2 or change[0] not in memo.objects:
                raise Malformed("a change")
            n, node = change
            target = memo.objects.pop(n)  # the node defines n again: build a copy, then move its contents over
            try:
                value = self.decode(node, memo, budget)
            finally:
                memo.objects[n] = target
                memo.ids[id(target)] = n
            _refill(target, value)



def _refill(target, value):
    kind = type(target)
    if type(value) is not kind:
        raise Malformed("a change of another type")
    if kind is list or kind is bytearray:
        target[:] = value
    elif kind is collections.Counter:
        dict.clear(target)
        dict.update(target, value)
    elif kind in (dict, collections.OrderedDict, collections.defaultdict):
        target.clear()
        target.update(value)
    elif kind is set:
        target.clear()
        target.update(value)
    elif kind is collections.deque:
        target.clear()
        target.extend(value)
