"""Reading an answer out of text: any input as a string, and the content of \\boxed{...} (`extract_boxed`)."""

from __future__ import annotations

import re

_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5"), or None if absent or unbalanced.

    >>> extract_boxed("so \\\\boxed{1} then \\\\boxed{\\\\frac{3}{4}}.")
    '\\\\frac{3}{4}'
    >>> extract_boxed("\\\\boxed 5$."), extract_boxed("\\\\boxed{12"), extract_boxed("no box")
    ('5', None, None)
    """
    box = last_box(as_text(text))
    return None if box is None else box[2]


def last_box(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last box in the text (the innermost, when boxes nest), or None if
    absent or unbalanced."""
    return box_at(text, max(text.rfind("\\boxed"), text.rfind("\\fbox")))


def last_outer_box(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last box not inside another, or None if absent or unbalanced: in
    "\\boxed{41 or \\boxed{42}}" the answer is "41 or \\boxed{42}", not "42"."""
    last, i = None, 0
    while True:
        m = _BOX_START.search(text, i)
        if m is None:
            return last
        start = m.start()
        box = box_at(text, start)
        if box is None:
            if _opens_box(text, start):
                return None  # unbalanced: whatever follows is inside it
            i = start + 5
        else:
            last, i = box, box[1]


def _opens_box(text: str, start: int) -> bool:
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    return i < len(text) and (text[i] == "{" or text[i].isspace())


def box_at(text: str, start: int) -> tuple[int, int, str] | None:
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        for m in _BRACE.finditer(text, j):
            depth += 1 if m.group() == "{" else -1
            if depth == 0:
                return start, m.end(), text[j + 1 : m.start()]
        return None
    if j == i:  # "\boxedx" is another command; only "\boxed 5" takes an unbraced argument
        return None
    raw = _NON_SPACE.match(text, j).group()  # not text[j:].split(): a box per call must cost its token only
    token = raw.split("$", 1)[0].rstrip(".")
    return (start, j + len(raw), token) if token else None


_BOX_START = re.compile(r"\\(?:boxed|fbox)")
_NON_SPACE = re.compile(r"\S*")


def as_text(value) -> str:
    """Any input as a string; grading must accept whatever a caller hands it."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        return ""
