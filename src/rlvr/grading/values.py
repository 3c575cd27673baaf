"""A program's values as the trainer reads them: compared with a test's expected literal without building them.

The judge (`rlvr.sandbox.harness`) sends a checked value back as `encode`'s text, a literal of exact built-in
values that the program chose. Building that value here (`ast.literal_eval`, `harness.decode`) would let the
program spend the trainer's CPU outside every sandbox limit: a set or dict of ints whose hashes collide costs
quadratic time to build, and a long one hashes and compares for seconds. So the text is never turned into
containers here. `canonical_text` reads it in one pass into a canonical spelling, and `canonical` spells a
Python value the same way; two plain values are equal (Python's `==`) exactly when their spellings are:

    numbers      True == 1 == 1.0 == (1+0j) all read "1"; -0.0 reads "0"; a float that is not a whole number
                 below 2**53 keeps its repr, and so does an int equal to one ("1e+300"); complex "(1+2j)"
    str, bytes   their repr (never equal to each other)
    list, tuple  "[a, b]", "(a,)"
    set          "{a, b}" with the members' spellings sorted; frozenset the same (frozenset({1}) == {1})
    dict         "{k: v, ...}" with the items' spellings sorted (insertion order does not count)
    NaN          no spelling (None): a value holding it equals nothing (a test's literal never holds NaN)

Bounded: a text over `MAX_CHARS`, nested deeper than `MAX_DEPTH`, or not of `encode`'s grammar has no
spelling; reading is one regular-expression pass over the text plus sorting the members of each set and
dict (strings, compared by the C sort; nothing is hashed), so its cost grows with n log n of the text
whatever the program chose. `comparable` adds the cheaper bound callers use first: a value more than
`RATIO` times as long as the expected one's spelling cannot equal it.
"""

from __future__ import annotations

import ast
import math
import re

MAX_CHARS = 1_000_000  # the judge's own cap on one encoded value (harness.VALUE_CAP)
MAX_DEPTH = 64  # encode nests at most 50 deep
# the longest exact spelling of a number is ~52 times its canonical one (int(1e308): 309 digits; "1e+308");
# True is 4 times "1", (3+0j) 6 times "3"
RATIO = 64
_EXACT_FLOAT = 2**53

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<str>b?'(?:[^'\\\n]|\\.)*'|b?"(?:[^"\\\n]|\\.)*")
    | (?P<complex>\(-?(?:\d+(?:\.\d+)?(?:e[+-]\d+)?|inf|nan)[+-](?:\d+(?:\.\d+)?(?:e[+-]\d+)?|inf|nan)j\)
                  |-?\d+(?:\.\d+)?(?:e[+-]\d+)?j)
    | (?P<num>-?\d+(?:\.\d+)?(?:e[+-]\d+)?)
    | (?P<word>None|True|False|set\(\)|frozenset\(\)|frozenset\(|float\('(?:nan|inf|-inf)'\))
    | (?P<punct>[\[\](){},:])
    )""", re.X)


class _Unreadable(Exception):
    pass


def number(value) -> str | None:
    """The canonical spelling of an int, float, complex or bool (see the module docstring)."""
    if type(value) is complex:
        if value.imag != 0:
            if math.isnan(value.real) or math.isnan(value.imag):
                return None
            return repr(complex(value.real + 0.0, value.imag + 0.0))  # + 0.0 turns -0.0 into 0.0
        value = value.real
    if type(value) is float:
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        if value.is_integer() and abs(value) < _EXACT_FLOAT:
            return str(int(value))
        return repr(value)
    value = int(value)  # bool
    if abs(value) < _EXACT_FLOAT:
        return str(value)
    try:
        exact = float(value) == value
    except OverflowError:
        exact = False
    return repr(float(value)) if exact else str(value)


def canonical(value) -> str | None:
    """The canonical spelling of a plain Python value (a test's literal), or None when it has none (NaN,
    or a type that is not an exact built-in value)."""
    try:
        return _spell(value, 0)
    except (_Unreadable, RecursionError, ValueError):
        return None


def _spell(value, depth: int) -> str:
    if depth > MAX_DEPTH:
        raise _Unreadable
    kind = type(value)
    if value is None:
        return "None"
    if kind in (bool, int, float, complex):
        text = number(value)
        if text is None:
            raise _Unreadable
        return text
    if kind in (str, bytes):
        return repr(value)
    if kind in (list, tuple):
        parts = [_spell(v, depth + 1) for v in value]
        if kind is list:
            return "[" + ", ".join(parts) + "]"
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if kind in (set, frozenset):
        return _set([_spell(v, depth + 1) for v in value])
    if kind is dict:
        return _dict([_spell(k, depth + 1) + ": " + _spell(v, depth + 1) for k, v in value.items()])
    raise _Unreadable


def _set(parts: list[str]) -> str:
    return "{" + ", ".join(sorted(parts)) + "}" if parts else "set()"


def _dict(items: list[str]) -> str:
    return "{" + ", ".join(sorted(items)) + "}"


def _atom(match: re.Match) -> str:
    if match.group("str") is not None:
        token = match.group("str")
        quote = token[-1]
        if "\\" not in token and token.isascii() and token.isprintable() and (quote == "'" or "'" in token):
            return token  # repr of a printable ASCII string is the token itself, on any Python
        return repr(ast.literal_eval(token))  # one string literal: linear in its length
    if match.group("complex") is not None:
        text = number(complex(match.group("complex")))
    else:
        token = match.group("num")
        text = number(float(token) if ("." in token or "e" in token) else int(token))
    if text is None:
        raise _Unreadable
    return text


def canonical_text(text: str) -> str | None:
    """The canonical spelling of the value `encode` wrote as `text`, read in one pass without building it;
    None when the text is too long, too deep, holds NaN, or is not of encode's grammar."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        return None
    try:
        return _read(text)
    except (_Unreadable, ValueError, SyntaxError, MemoryError, OverflowError):
        return None


def _read(text: str) -> str:
    # open containers, innermost last: [opener, parts, held value, pending dict key, dict/set mode, last kind]
    stack: list[list] = []
    done: str | None = None
    last = "open"  # what came before: "open" (start or an opener), "value", "comma" or "colon"
    pos = 0
    while True:
        match = _TOKEN.match(text, pos)
        if match is None:
            if text[pos:].strip():
                raise _Unreadable
            break
        pos = match.end()
        punct, word = match.group("punct"), match.group("word")
        if punct in ("[", "(", "{") or word == "frozenset(":
            if last == "value" or len(stack) >= MAX_DEPTH:
                raise _Unreadable
            stack.append(["f" if word == "frozenset(" else punct, [], None, None, None, None])
            last = "open"
            continue
        if punct == "," or punct == ":":
            if last != "value" or not stack:
                raise _Unreadable
            frame = stack[-1]
            if frame[0] == "{":
                _flush(frame, punct)
            last = "comma" if punct == "," else "colon"
            continue
        kind = "other"
        if punct is not None:  # a closer
            if last == "colon" or not stack:
                raise _Unreadable
            opener, parts, held, key, mode, inner = frame = stack.pop()
            if {"[": "]", "(": ")", "{": "}", "f": ")"}[opener] != punct:
                raise _Unreadable
            if opener == "[":
                value = "[" + ", ".join(parts) + "]"
            elif opener == "(":
                if len(parts) == 1 and last == "value":  # (x) is x, not a tuple
                    value, kind = parts[0], inner
                else:
                    value = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
            elif opener == "f":  # frozenset({...}): one set
                if len(parts) != 1 or inner != "set":
                    raise _Unreadable
                value, kind = parts[0], "set"
            else:
                if last == "value":
                    _flush(frame, ",")
                if frame[3] is not None:
                    raise _Unreadable
                value, kind = (_dict(frame[1]), "dict") if frame[4] == "dict" or not frame[1] else (_set(frame[1]), "set")
        elif word is not None:
            if word in ("set()", "frozenset()"):
                value, kind = "set()", "set"
            elif word == "float('nan')":
                raise _Unreadable
            else:
                value = {"None": "None", "True": "1", "False": "0", "float('inf')": "float('inf')",
                         "float('-inf')": "float('-inf')"}[word]
        else:
            value = _atom(match)
        if last == "value" and punct is None:  # two values with nothing between
            raise _Unreadable
        last = "value"
        if not stack:
            if done is not None:
                raise _Unreadable
            done = value
            continue
        frame = stack[-1]
        if frame[0] == "{":
            frame[2] = value
        else:
            frame[1].append(value)
            frame[5] = kind
    if stack or done is None:
        raise _Unreadable
    return done


def _flush(frame: list, punct: str):
    """A brace container's held value meets a comma (a set member, or a dict item's value) or a colon (a
    dict key)."""
    held, key, mode = frame[2], frame[3], frame[4]
    frame[2] = None
    if punct == ":":
        if key is not None or mode == "set":
            raise _Unreadable
        frame[3], frame[4] = held, "dict"
    elif key is not None:
        frame[1].append(key + ": " + held)
        frame[3] = None
    else:
        if mode == "dict":
            raise _Unreadable
        frame[1].append(held)
        frame[4] = "set"


def comparable(text: str, spelling: str) -> bool:
    """Whether `text` is short enough that it could spell a value equal to one spelled `spelling`."""
    return len(text) <= RATIO * len(spelling) + RATIO


def read_str(text: str) -> str | None:
    """The str that `encode` wrote as `text` (one string literal, read in linear time), or None."""
    if not isinstance(text, str) or len(text) > MAX_CHARS or text[:1] not in ("'", '"'):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if type(value) is str else None
