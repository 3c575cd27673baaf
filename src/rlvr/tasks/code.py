"""Code tasks as typed records: a generated `code` task and code JSONL files (MBPP, KodCode, HumanEval-like,
and stdin/stdout problems as in APPS or CodeContests).

A code example's `answer` is what the code reward grades against: the JSON string
`{"entry_point": <name or null>, "tests": [<Python source>, ...]}` built by `code_answer`, where each test
is one assert statement (`assert sum_evens([1, 2, 4]) == 6`) or a block of test code (pytest functions,
unittest TestCases, HumanEval's check), or `{"stdio": [[stdin, stdout], ...], "compare": ...}` built by
`stdio_answer` for a program run as a script on each input. Its `solution` is a reference program, the SFT
target (`code_response`).

The generated task asks for one small function from a plain-English spec with its signature. The tests are
hidden: their inputs never appear in the question, and their expected values come from running the task's
own reference solution once, at generation time (our code, never the model's). Question texts are split
between train / validation / test by a hash, so no question of one split is ever asked in another.

This module must stay cheap (no torch) and must not import the reward code.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import random
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from rlvr.grading.code_tests import COMPARES, CodeTestsError, parse_tests
from rlvr.tasks.code_families import EMPTY, FAMILIES, FRAMES, PAIRS, PARAMS, Family, draw
from rlvr.tasks.records import SPLITS, DataError, Example, dataset_options, jsonl_rows

CODE_LEVELS = (1, 2, 3)
CODE_SPLIT_SIZES = {"train": 20000, "validation": 500, "test": 1000}


def code_answer(tests: list[str], entry_point: str | None) -> str:
    """The ground truth of a code example: its tests and the function they call, as one JSON string.

    >>> code_answer(["assert f(1) == 2"], "f")
    '{"entry_point": "f", "tests": ["assert f(1) == 2"]}'
    """
    if isinstance(tests, str) or not all(isinstance(t, str) for t in tests):
        raise TypeError(f"code_answer: tests must be a list of strings; got {tests!r:.80}")
    if entry_point is not None and not isinstance(entry_point, str):
        raise TypeError(f"code_answer: entry_point must be a string or None; got {entry_point!r}")
    return json.dumps({"entry_point": entry_point, "tests": list(tests)}, sort_keys=True)


def stdio_answer(cases: list[tuple[str, str]], compare: str = "whitespace") -> str:
    """The ground truth of a stdin/stdout problem: each (stdin, expected stdout), and how outputs compare
    ("exact", "whitespace": the same whitespace-separated tokens, "float": those tokens, numbers within 1e-6).

    >>> stdio_answer([("1 2\\n", "3\\n")])
    '{"compare": "whitespace", "entry_point": null, "stdio": [["1 2\\n", "3\\n"]]}'
    """
    if compare not in COMPARES:
        raise ValueError(f"stdio_answer: compare must be one of {', '.join(COMPARES)}; got {compare!r}")
    if isinstance(cases, (str, dict)) or not all(
            isinstance(c, (list, tuple)) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in cases):
        raise TypeError(f"stdio_answer: cases must be (stdin, stdout) pairs of strings; got {cases!r:.80}")
    return json.dumps({"entry_point": None, "stdio": [list(c) for c in cases], "compare": compare}, sort_keys=True)


# ----------------------------------------------------------------------------------------------------
# SFT targets.

_SIGNATURE = re.compile(r"`([A-Za-z_]\w*\([^`]*\))`")
_CODE_START = ("def ", "from ", "import ", "class ", "@", '"""', "'''", "#")


def _links() -> set[str]:
    """The words between the signature and " returns " in the generated task's phrasings (`FRAMES`)."""
    return {frame.split("{sig}`", 1)[1].split(" returns ", 1)[0] for frame in FRAMES}


def code_reasoning(example: Example) -> str:
    """One sentence restating what the question asks for: the think block of a code SFT target.

    >>> code_reasoning(Example("Write a Python function `f(s)` that returns `s` reversed.", "{}"))
    'I need `f(s)` to return `s` reversed.'
    >>> code_reasoning(Example("Write `f(s)`; it takes a string and returns it reversed.", "{}"))
    'I need to write `f(s)`; it takes a string and returns it reversed.'
    >>> code_reasoning(Example("Write a function to find the shared elements of two lists.", "{}"))
    'I need to write a function to find the shared elements of two lists.'
    """
    question = " ".join(example.question.split())
    match = _SIGNATURE.search(question)
    if match and " returns " in question[match.end():]:
        link, wanted = question[match.end():].split(" returns ", 1)
        if link in _LINKS:  # one of the generated task's phrasings
            return f"I need `{match.group(1)}` to return {wanted.rstrip(' .')}."
    try:
        entry_point = json.loads(example.answer).get("entry_point")
    except (ValueError, AttributeError):
        entry_point = None
    named = f" The function is `{entry_point}`." if entry_point else ""
    if not question or question.startswith(_CODE_START):  # HumanEval-style: the question is a stub to complete
        return f"I need to complete the function `{entry_point}`." if entry_point else "I need to write the program."
    first = re.match(r"(.+?[.!?])(\s|$)", question)
    sentence = first.group(1) if first else question
    if len(sentence) > 240:
        sentence = sentence[:240].rsplit(" ", 1)[0] + " ..."
    if sentence[:6].lower() == "write ":
        return f"I need to write {sentence[6:]}{named}"
    return f"I need to solve this: {sentence}{named}"


def code_response(example: Example, think: bool) -> str:
    """The SFT target of a code prompt: (with `think`, the rest of an r1_zero-style think block, then) the
    reference solution in one ```python block, ending with the "\\n```\\n" the code prompts stop at.

    >>> ex = Example("Write a function `f(s)` that returns `s` reversed.", "{}", "def f(s):\\n    return s[::-1]")
    >>> code_response(ex, think=False)
    '```python\\ndef f(s):\\n    return s[::-1]\\n```\\n'
    >>> code_response(ex, think=True)
    ' I need `f(s)` to return `s` reversed. </think>\\n```python\\ndef f(s):\\n    return s[::-1]\\n```\\n'
    """
    code = example.solution.strip("\n").rstrip()
    if not code.strip():
        raise ValueError(f"example {example.id or example.question[:60]!r} has no reference solution to train on")
    block = f"```python\n{code}\n```\n"
    return f" {code_reasoning(example)} </think>\n{block}" if think else block


# ----------------------------------------------------------------------------------------------------
# Loading a code JSONL.


def _test_from_pair(pair: dict, entry_point: str) -> str:
    args = pair["input"] if isinstance(pair["input"], list) else [pair["input"]]
    for value in (*args, pair["output"]):
        ast.literal_eval(repr(value))  # NaN or Infinity (which json reads) have no literal: ValueError
    return f"assert {entry_point}({', '.join(map(repr, args))}) == {pair['output']!r}"


def load_code_jsonl(
    path: str | Path,
    question_field: str = "prompt",
    tests_field: str = "tests",
    entry_point_field: str = "entry_point",
    solution_field: str = "solution",
    compare_field: str = "compare",
) -> list[Example]:
    """Read a JSONL file of code problems into Examples whose answer is `code_answer(tests, entry_point)`, or
    `stdio_answer(cases, compare)` for a problem whose program reads stdin and prints its answer.

    Each row has the question and the tests; `tests` is a list of assert strings, one string of test code,
    a list of {"input": [args...], "output": value} pairs (an `input` that is not a list is the one argument),
    which become `assert entry_point(*input) == output` and so need the row's entry point, a list of
    {"stdin": text, "stdout": text} pairs, or APPS's {"inputs": [...], "outputs": [...]} (as an object or its
    JSON text): calls of the entry point where the row has one (or a "fn_name"), else stdin/stdout pairs. A
    stdin/stdout row may say how outputs compare (`compare_field`: exact, whitespace (the default) or float).
    The entry point and the reference solution (MBPP: solution_field="code") are optional. A malformed line
    fails with the file, the line number and the field.
    """
    path = Path(path)
    examples = []
    for lineno, where, row in jsonl_rows(path, (question_field, tests_field)):
        question, raw_tests = row[question_field], row[tests_field]
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: field {question_field!r} must be a non-empty string")
        entry_point = row.get(entry_point_field)
        if entry_point is not None and (not isinstance(entry_point, str) or not entry_point.isidentifier()):
            raise DataError(f"{where}: field {entry_point_field!r} must be a Python name or null; "
                            f"got {entry_point!r}")
        solution = row.get(solution_field)
        if solution is not None and not isinstance(solution, str):
            raise DataError(f"{where}: field {solution_field!r} must be a string; got {type(solution).__name__}")
        field = f"{where}: field {tests_field!r}"
        raw_tests, entry_point = _apps(raw_tests, entry_point, field)
        if _is_stdio(raw_tests):
            compare = row.get(compare_field, "whitespace")
            if compare not in COMPARES:
                raise DataError(f"{where}: field {compare_field!r} must be one of {', '.join(COMPARES)}; got {compare!r}")
            answer = stdio_answer(_read_stdio(raw_tests, field), compare)
        else:
            answer = code_answer(_read_tests(raw_tests, entry_point, field, entry_point_field), entry_point)
        examples.append(Example(question.strip(), answer, solution or "", id=f"{path.stem}:{lineno}", fields=row))
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def _apps(raw, entry_point: str | None, where: str):
    """APPS's {"inputs": [...], "outputs": [...]} (or its JSON text): calls of `fn_name` or the entry point, as
    input/output pairs; else stdin/stdout pairs. Anything else is returned as it is."""
    if isinstance(raw, str) and raw.lstrip().startswith("{"):
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        raw = parsed if isinstance(parsed, dict) and "inputs" in parsed else raw
    if not (isinstance(raw, dict) and "inputs" in raw):
        return raw, entry_point
    inputs, outputs = raw.get("inputs"), raw.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
        raise DataError(f"{where}: 'inputs' and 'outputs' must be lists of the same, non-zero length")
    name = raw.get("fn_name") or entry_point
    if name:
        if not (isinstance(name, str) and name.isidentifier()):
            raise DataError(f"{where}: fn_name must be a Python name; got {name!r}")
        return [{"input": i, "output": o} for i, o in zip(inputs, outputs)], name
    text = [["\n".join(map(str, x)) if isinstance(x, list) else x for x in pair] for pair in zip(inputs, outputs)]
    return [{"stdin": i, "stdout": o} for i, o in text], entry_point


def _is_stdio(raw) -> bool:
    return isinstance(raw, list) and bool(raw) and all(isinstance(item, dict) and "stdin" in item for item in raw)


def _read_stdio(raw: list, where: str) -> list[tuple[str, str]]:
    cases = []
    for i, item in enumerate(raw, start=1):
        if set(item) != {"stdin", "stdout"} or not all(isinstance(item[k], str) for k in item):
            raise DataError(f"{where} item {i}: a stdin/stdout pair needs exactly the keys 'stdin' and 'stdout', "
                            "both strings")
        cases.append((item["stdin"], item["stdout"]))
    return cases


def _read_tests(raw, entry_point: str | None, where: str, entry_point_field: str) -> list[str]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise DataError(f"{where} must be a list of tests or a string of test code; got {type(raw).__name__}")
    if not raw:
        raise DataError(f"{where} is empty: a problem needs at least one test")
    tests = []
    for i, item in enumerate(raw, start=1):
        if isinstance(item, dict):
            if set(item) != {"input", "output"}:
                raise DataError(f"{where} item {i}: an input/output pair needs exactly the keys 'input' and "
                                f"'output'; got {', '.join(map(repr, item)) or 'none'}")
            if entry_point is None:
                raise DataError(f"{where} item {i}: input/output pairs need an entry point (field "
                                f"{entry_point_field!r}) to call")
            try:
                item = _test_from_pair(item, entry_point)
            except ValueError:
                raise DataError(f"{where} item {i}: a value has no Python literal (NaN or Infinity?)") from None
        elif not isinstance(item, str):
            raise DataError(f"{where} item {i}: expected an assert string or an input/output pair; "
                            f"got {type(item).__name__}")
        if not item.strip():
            raise DataError(f"{where} item {i}: empty test")
        try:
            ast.parse(item)
        except SyntaxError as err:
            raise DataError(f"{where} item {i}: not valid Python ({err.msg}, line {err.lineno})") from None
        tests.append(item)
    try:  # how the judge will run them: a test file whose checks cannot run is refused now, with the reason
        parse_tests(code_answer(tests, entry_point))
    except CodeTestsError as err:
        raise DataError(f"{where}: {err}") from None
    return tests


# ----------------------------------------------------------------------------------------------------
# The generated code task.


@dataclasses.dataclass(frozen=True)
class CodeSpec:
    """Difficulty knob: `level` 1 (one expression), 2 (a loop or a comprehension with a condition, or two
    steps) or 3 (combinations: filter, map and aggregate; nested conditions; dictionaries)."""

    level: int = 2

    @classmethod
    def parse(cls, name: str) -> CodeSpec:
        """"code" or "code:level=3"."""
        values = dataset_options(name, ("level",), "option level=<1, 2 or 3>")
        spec = cls(**values)
        if spec.level not in CODE_LEVELS:
            raise DataError(f"dataset {name!r}: level must be 1, 2 or 3; got {spec.level}")
        return spec


_LINKS = _links()


def code_families(level: int) -> tuple[str, ...]:
    """The keys of the task families of a level (each level has its own)."""
    return tuple(f.key for f in FAMILIES if f.level == level)


def _split_of(question: str) -> str:
    """The split a question text belongs to: a hash, so the splits never share a question."""
    bucket = int(hashlib.sha256(question.encode("utf-8")).hexdigest()[:8], 16) % 10
    return "validation" if bucket == 0 else "test" if bucket == 1 else "train"


_REFERENCES: dict[str, Callable] = {}  # source -> function; the sources of a level number in the thousands


def _reference(source: str, name: str) -> Callable:
    """The reference solution as a function: our own generated source, run once per distinct source."""
    fn = _REFERENCES.get(source)
    if fn is None:
        namespace: dict = {}
        exec(compile(source, "<code task reference>", "exec"), namespace)
        fn = _REFERENCES[source] = namespace[name]
    return fn


def _render(args: tuple) -> str:
    return ", ".join(repr(a) for a in args)


def _code_example(rng: random.Random, families: list[Family], split: str, index: int) -> Example:
    while True:  # draw questions until one belongs to this split (about 1 in 10 for validation and test)
        fam = rng.choice(families)
        consts = fam.consts(rng)
        if fam.args == ("ints", "ints"):
            params = dict(zip("ab", rng.choice(PAIRS)))
        else:
            params = {"a": rng.choice(PARAMS[fam.args[0]])}
        name = rng.choice(fam.names).format(**consts)
        sig = f"{name}({', '.join(params.values())})"
        text = fam.text.format(**params, **consts)
        question = rng.choice(FRAMES).format(sig=sig, text=text)
        if _split_of(question) == split:
            break
    body = fam.body.format(**params, **consts)
    source = f"def {sig}:\n" + "\n".join("    " + line for line in body.splitlines())
    fn = _reference(source, name)
    tests = _hidden_tests(rng, fam, consts, fn, name, question)
    return Example(question, code_answer(tests, name), source, id=f"code:{index}")


def _hidden_tests(rng: random.Random, fam: Family, consts: dict, fn, name: str, question: str) -> list[str]:
    """4-6 asserts on fresh inputs (an empty one where that is fair), with at least two different expected
    values where the family allows; no input's text appears in the question."""
    count = rng.randint(4, 6)
    for _ in range(30):
        inputs: dict[str, tuple] = {}
        if fam.edge:
            edge = tuple(EMPTY[kind] for kind in fam.args)
            if _render(edge) not in question:
                inputs[_render(edge)] = edge
        for _ in range(100):
            if len(inputs) >= count:
                break
            args = fam.draw(rng, consts) if fam.draw else tuple(draw(kind, rng) for kind in fam.args)
            text = _render(args)
            if text not in inputs and text not in question:
                inputs[text] = args
        cases = [(text, fn(*args)) for text, args in inputs.items()]
        if len({repr(out) for _, out in cases}) >= 2:
            break
    order = list(cases)
    rng.shuffle(order)
    return [f"assert {name}({text}) == {out!r}" for text, out in order]


def code_task(split: str = "train", n: int | None = None, spec: CodeSpec | None = None) -> list[Example]:
    """Generated code problems; each split draws from its own seeded stream and owns its own question texts
    (a hash of the text assigns it to train, validation or test: 8 / 1 / 1 in 10)."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    spec = spec or CodeSpec()
    return list(_generate(split, n if n is not None else CODE_SPLIT_SIZES[split], spec.level))


@lru_cache(maxsize=8)
def _generate(split: str, n: int, level: int) -> tuple[Example, ...]:
    # about a second for a 20000-example train split, which each loop (and a sweep's check) loads again
    families = [f for f in FAMILIES if f.level == level]
    rng = random.Random(f"rlvr-code-{split}-{level}")
    return tuple(_code_example(rng, families, split, i) for i in range(n))
