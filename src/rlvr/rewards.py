"""Answer grading and reward functions for GSM8K (seed 004 §3.3 and §4.2.3).

A reward function maps `(response, ground_truth)` to `{"reward", "format_reward", "answer_reward"}`.
Grading an extracted answer against the ground truth takes one of two paths:

* the fast path, in-process: both sides are plain numbers, perhaps dressed as "$1,000", "72 apples",
  "50%", "3/4" or "\\text{72}". They are compared exactly as `fractions.Fraction`, never as floats.
  Nearly every GSM8K answer takes this path;
* the slow path: anything else ("\\frac{3}{4}", "2^{10}", "x = 5") goes to `math_verify`, run in a pool
  of worker processes with a hard time limit per answer (default 1 s). An answer that runs out of time
  scores 0, its worker is killed, and the timeout is counted; nothing the model writes can hang, crash
  or raise out of a run.

`score_batch` extracts every answer in-process and sends only the slow-path answers to the pool, all at
once, so a batch is graded in parallel on the available cores.

How this departs from the assignment's reference grader (`drgrpo_grader.py`):

1. Equivalence is math-verify plus a small exact fast path, not a hand-written normaliser and sympy.
2. The r1_zero answer is the last complete <answer>...</answer> block; text after a last, unclosed
   <answer> (a truncated second block) is ignored, and a response whose only "</answer>" comes before
   "</think> <answer>" fails the format.
3. A time limit that kills the worker, rather than signal.alarm, which cannot interrupt a long C call
   such as the big-integer power in "9**9**9**9".

This module does not import torch (the grading workers import it and must start fast); only
`compute_rollout_rewards` does, when called. The workers start with multiprocessing's forkserver, which
imports the main script: a script that grades needs the usual `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import math
import multiprocessing
import os
import re
import signal
import threading
import time
from fractions import Fraction
from typing import Callable, Sequence

__all__ = [
    "REWARD_FNS",
    "RewardFn",
    "answer_tag_reward_fn",
    "combine_rewards",
    "compute_rollout_rewards",
    "configure_grading",
    "extract_boxed",
    "format_reward_fn",
    "get_reward_fn",
    "grade_answer",
    "grading_stats",
    "parse_gsm8k_answer",
    "question_only_reward_fn",
    "r1_zero_reward_fn",
    "reset_grading_stats",
    "score_batch",
    "shutdown_grading",
]

Scores = dict[str, float]

# ----------------------------------------------------------------------------------------------------
# Ground truth and answer extraction.


def parse_gsm8k_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after the last "####", without thousands commas.

    >>> parse_gsm8k_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 1,234")
    '1234'
    """
    text = str(solution)
    if "####" not in text:
        raise ValueError(f"GSM8K solution has no '####' final-answer line: ...{text[-120:]!r}")
    answer = text.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise ValueError(f"GSM8K solution has nothing after its '####': ...{text[-120:]!r}")
    return answer


_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5"), or None if absent or unbalanced.

    >>> extract_boxed("so \\\\boxed{1} then \\\\boxed{\\\\frac{3}{4}}.")
    '\\\\frac{3}{4}'
    >>> extract_boxed("\\\\boxed 5$."), extract_boxed("\\\\boxed{12"), extract_boxed("no box")
    ('5', None, None)
    """
    text = _as_text(text)
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
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
                return text[j + 1 : m.start()]
        return None
    if j == i:  # "\boxedx" is another command; only "\boxed 5" takes an unbraced argument
        return None
    token = text[j:].split(None, 1)[0] if text[j:].strip() else ""
    token = token.split("$", 1)[0].rstrip(".")
    return token or None


def _as_text(value) -> str:
    """Any input as a string; grading must accept whatever a caller hands it."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        return ""


# ----------------------------------------------------------------------------------------------------
# The fast path: plain numbers, compared exactly.

_MAX_FAST_CHARS = 200  # longer strings are never plain numbers worth parsing here
_MAX_DIGITS = 100  # keeps Fraction/int far from Python's 4,300-digit limit and from slow arithmetic
_MAX_SLOW_CHARS = 2000  # an "answer" longer than this is prose, not an answer; scored 0 unseen

_UNICODE = str.maketrans({"\u2212": "-", "\u2013": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\uff04": "$"})
_LATEX_SPACING = re.compile(r"\\[,;: ]|~")
_INLINE_TEXT = re.compile(
    r"\\(?:text|textbf|textrm|textit|textnormal|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}"
)
_OUTER_WRAPPERS = [
    re.compile(r"\\(?:boxed|fbox)\s*\{(.*)\}", re.S),
    re.compile(r"\$(.*)\$", re.S),
    re.compile(r"\\\((.*)\\\)", re.S),
    re.compile(r"\\\[(.*)\\\]", re.S),
    re.compile(r"\*\*(.*)\*\*", re.S),
]
_NUMBER = re.compile(
    r"""(?P<sign>[-+]?)\s*(?:US\$|USD|\$|€|£)?\s*(?P<sign2>[-+]?)\s*
    (?P<num>[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?   # 1,234,567.89
       |[0-9]{1,3}(?:\ [0-9]{3})+(?:\.[0-9]+)?      # 1 234 567
       |[0-9]+(?:\.[0-9]+)?|\.[0-9]+)
    (?:\s*/\s*(?P<den>[0-9]+))?                      # 3/4
    (?=[^0-9,.]|\.(?![0-9])|$)""",
    re.X | re.A,
)
_SUFFIX = re.compile(r"[A-Za-z'’./$\-\s]*", re.A)
_WORD = re.compile(r"[a-z]+")
_SCALES = {
    "k": 1000, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12, "dozen": 12, "hundred": 100
}
# Words after a number that change its value: sending these to math-verify beats misreading them as units.
_VALUE_WORDS = frozenset(
    "and plus minus times over point or half halves quarter quarters third thirds fourth fourths fifth fifths "
    "sixths eighths tenths squared cubed pi zero one two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty "
    "ninety hundred hundreds thousand thousands million millions billion billions trillion dozen dozens "
    "percent percentage cent".split()
)


def _normalize(text: str) -> str:
    """Strip the LaTeX and markdown dress around a would-be number: "$\\boxed{\\$1,000}$." -> "$1,000"."""
    s = text.translate(_UNICODE).replace("\\$", "$").replace("\\%", "%").replace("{,}", ",").replace("\\!", "")
    s = _INLINE_TEXT.sub(r" \1 ", _LATEX_SPACING.sub(" ", s))
    for _ in range(8):
        before = s
        s = s.strip().rstrip(".,;:!").strip()
        for wrapper in _OUTER_WRAPPERS:
            m = wrapper.fullmatch(s)
            if m:
                s = m.group(1)
                break
        if s == before:
            break
    return s


def _plain_number(text: str) -> tuple[Fraction, Fraction | None] | None:
    """(value as written, value scaled by a trailing % or magnitude word or None), or None if not a plain number.

    >>> _plain_number("$1,000.00 dollars"), _plain_number("50%"), _plain_number("1,00")
    ((Fraction(1000, 1), None), (Fraction(50, 1), Fraction(1, 2)), None)
    """
    if len(text) > _MAX_FAST_CHARS:
        return None
    s = _normalize(text)
    m = _NUMBER.match(s)
    if m is None or (m.group("sign") and m.group("sign2")):
        return None
    digits = re.sub(r"[^0-9]", "", m.group("num")) + (m.group("den") or "")
    if len(digits) > _MAX_DIGITS:
        return None
    rest = s[m.end() :].strip()
    percent = rest.startswith("%")
    rest = rest[1:] if percent else rest
    if not _SUFFIX.fullmatch(rest):
        return None  # more digits, braces, operators: not a plain number
    words = _WORD.findall(rest.lower())
    if not percent and words[:1] in (["percent"], ["percentage"]):
        percent, words = True, words[1:]
    elif not percent and words[:2] == ["per", "cent"]:
        percent, words = True, words[2:]
    scale = _SCALES.get(words[0]) if words and not percent else None
    if scale is not None:
        words = words[1:]
    if any(w in _VALUE_WORDS for w in words):
        return None
    value = Fraction(m.group("num").replace(",", "").replace(" ", ""))
    if m.group("den"):
        if int(m.group("den")) == 0:
            return None
        value /= int(m.group("den"))
    if "-" in (m.group("sign"), m.group("sign2")):
        value = -value
    if percent:
        return value, value / 100
    return value, (value * scale if scale is not None else None)


def _fast_grade(answer: str, ground_truth: str) -> bool | None:
    """True/False when both sides are plain numbers; None when math-verify must decide.

    A percentage or magnitude word in the answer may be read either way ("50%" is right for 50 and for
    0.5, "5 million" for 5 and for 5000000); one in the ground truth sends the pair to math-verify.
    """
    gold = _plain_number(ground_truth)
    if gold is None or gold[1] is not None:
        return None
    pred = _plain_number(answer)
    if pred is None:
        return None
    return pred[0] == gold[0] or pred[1] == gold[0]


# ----------------------------------------------------------------------------------------------------
# The slow path: math-verify in a pool of worker processes, killed at the time limit.

_DEFAULT_TIMEOUT = 1.0
_STARTUP_GRACE_S = 60.0  # a worker that never starts must not hang the caller either
_RESTART_S = 5.0  # allowance per queued task for killing and replacing a timed-out worker

_config = {"timeout": _DEFAULT_TIMEOUT, "max_workers": None}
_pool = None
_pool_pid: int | None = None
_pool_lock = threading.RLock()
_STAT_KEYS = ("fast_path", "slow_path", "timeouts", "errors", "too_long")
_stats = dict.fromkeys(_STAT_KEYS, 0)
_stats_lock = threading.Lock()


def configure_grading(timeout: float = _DEFAULT_TIMEOUT, max_workers: int | None = None) -> None:
    """Set the hard time limit per slow-path grading (seconds) and the pool size (None: os.cpu_count()).

    Calling it with no arguments restores the defaults. A new pool size takes effect at the next grading.

    >>> configure_grading(timeout=0.5); configure_grading()
    """
    timeout = float(timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"configure_grading: timeout must be a positive number of seconds; got {timeout!r}")
    if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
        raise ValueError(f"configure_grading: max_workers must be a positive integer or None; got {max_workers!r}")
    with _pool_lock:
        if max_workers != _config["max_workers"]:
            shutdown_grading()
        _config.update(timeout=timeout, max_workers=max_workers)


def grading_stats() -> dict[str, int]:
    """Counts since start (or the last reset): gradings by fast and slow path, timeouts, errors, and
    answers too long to grade (scored 0 without a look)."""
    with _stats_lock:
        return dict(_stats)


def reset_grading_stats() -> None:
    with _stats_lock:
        _stats.update(dict.fromkeys(_STAT_KEYS, 0))


def shutdown_grading() -> None:
    """Stop the worker pool (registered atexit); the next slow-path grading starts a new one."""
    global _pool, _pool_pid
    with _pool_lock:
        pool, owned = _pool, _pool_pid == os.getpid()
        _pool, _pool_pid = None, None
    if pool is not None and owned:  # a forked child must not stop its parent's pool threads
        try:
            # Closing lets a worker that is still booting (the replacement of a killed one) start and
            # exit cleanly; stopping it mid-boot makes it print a traceback. Stop only what hangs.
            pool.close()
            pool.join(timeout=_config["timeout"] + 2)
        except Exception:
            try:
                pool.stop()
                pool.join(timeout=5)
            except Exception:
                pass


def _worker_count() -> int:
    return _config["max_workers"] or os.cpu_count() or 1


def _get_pool():
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is not None and _pool_pid == os.getpid() and _pool.active:
            return _pool
        if _pool_pid == os.getpid():
            shutdown_grading()  # a broken pool (a worker start failed) is replaced, not reused
        from pebble import ProcessPool

        # Registered after pebble's own atexit hook, so it runs first (LIFO), while pebble still works.
        atexit.unregister(shutdown_grading)
        atexit.register(shutdown_grading)
        # Forking a process that holds torch threads is unsafe; forkserver forks from a clean server.
        if "forkserver" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("forkserver")
            # Workers fork from the server with math-verify (and sympy) already imported, so replacing a
            # worker killed at the time limit costs a fork, not a 0.5 s import. Adds to the default preload
            # (the main module); has no effect if the server is already running.
            context.set_forkserver_preload(["__main__", "rlvr.rewards", "math_verify"])
        else:
            context = multiprocessing.get_context("spawn")
        _pool = ProcessPool(max_workers=_worker_count(), initializer=_worker_init, context=context)
        _pool_pid = os.getpid()
        return _pool


def _worker_init() -> None:
    # pebble's SIGTERM handler is Python code, which cannot run until a long C call (a huge power) ends,
    # so pebble would wait 3 s before SIGKILL; the default action ends the worker at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _limit_memory()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    from math_verify import parse

    parse("\\boxed{1}")  # imports sympy and compiles the regexes before any task's clock starts


def _limit_memory(headroom: int = 2 << 30) -> None:
    """Cap the worker's address space, so an answer that builds a huge integer fails fast instead of
    taking the machine's memory before the time limit strikes."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            in_use = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = in_use + headroom
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except Exception:
        pass  # not Linux: no cap, the time limit still holds


_PROSE_DROP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{[^{}]*\}|\\[A-Za-z]+")
_PROSE_WORD = re.compile(r"[A-Za-z]{2,}")


def _mv_parse(text: str, seconds: int) -> list:
    """math-verify's parse of one answer. LaTeX is read as one expression ("\\boxed{2^{10}}" is 1024, where
    a bare "2^{10}" would be read as 2); prose ("The answer is 72") is searched for its final answer, as
    math-verify does with a whole model output, because read as LaTeX its words become symbols."""
    from math_verify import parse

    boxed = "\\boxed{" + text + "}"
    prose = _PROSE_WORD.search(_PROSE_DROP.sub(" ", text)) is not None
    for candidate in (text, boxed) if prose else (boxed, text):
        parsed = parse(candidate, parsing_timeout=seconds)
        if parsed:
            return parsed
    return []


def _slow_grade(answer: str, ground_truth: str, seconds: int) -> bool:
    """Runs in a worker: math-verify's verdict, with its own (whole-second, signal-based) timeouts."""
    from math_verify import verify

    gold = _mv_parse(ground_truth, seconds)
    pred = _mv_parse(answer, seconds)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=seconds))


def _run_slow(pairs: list[tuple[str, str]], timeout: float, counts: dict) -> list[bool]:
    """Grade all pairs in the pool at once; each gets `timeout` seconds of a worker, then is killed."""
    # math-verify's own timeout is a backstop set above the hard limit, so the kill (which is counted)
    # is what normally strikes.
    inner = math.ceil(timeout) + 1
    try:
        pool = _get_pool()
        futures = [pool.schedule(_slow_grade, args=(a, g, inner), timeout=timeout) for a, g in pairs]
    except Exception:
        counts["errors"] += len(pairs)
        shutdown_grading()
        return [False] * len(pairs)
    rounds = math.ceil(len(pairs) / _worker_count())
    _, late = concurrent.futures.wait(futures, timeout=_STARTUP_GRACE_S + rounds * (timeout + _RESTART_S))
    verdicts = []
    for future in futures:
        if future in late:
            future.cancel()
            counts["timeouts"] += 1
            verdicts.append(False)
            continue
        try:
            verdicts.append(future.result(timeout=0) is True)
        except TimeoutError:
            counts["timeouts"] += 1
            verdicts.append(False)
        except Exception:
            counts["errors"] += 1
            verdicts.append(False)
    return verdicts


def _grade_pairs(pairs: Sequence[tuple[str, str]], timeout: float | None = None) -> tuple[list[bool], dict]:
    """Grade many (answer, ground truth) pairs: fast path here, the rest concurrently in the pool, each
    distinct pair once. Returns the verdicts and this call's counts (see `grading_stats`) and seconds."""
    start = time.perf_counter()
    timeout = _config["timeout"] if timeout is None else float(timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        timeout = _config["timeout"]
    counts = dict.fromkeys(_STAT_KEYS, 0)
    verdicts = [False] * len(pairs)
    pending: dict[tuple[str, str], list[int]] = {}
    for i, (answer, gold) in enumerate(pairs):
        answer, gold = _as_text(answer).strip(), _as_text(gold).strip()
        try:
            decided = _fast_grade(answer, gold) if answer and gold else False
        except Exception:  # the fast path is only a shortcut; math-verify gets the pair instead
            decided = None
        if decided is not None:
            verdicts[i] = decided
            counts["fast_path"] += 1
        elif len(answer) > _MAX_SLOW_CHARS or len(gold) > _MAX_SLOW_CHARS:
            counts["too_long"] += 1
        else:
            pending.setdefault((answer, gold), []).append(i)
    if pending:
        counts["slow_path"] = len(pending)
        for indices, verdict in zip(pending.values(), _run_slow(list(pending), timeout, counts)):
            for i in indices:
                verdicts[i] = verdict
    with _stats_lock:
        for key in _STAT_KEYS:
            _stats[key] += counts[key]
    counts["seconds"] = time.perf_counter() - start
    return verdicts, counts


def grade_answer(model_answer: str, ground_truth: str, timeout: float | None = None) -> bool:
    """Whether an extracted answer equals the ground truth. Never raises; never takes much longer than
    `timeout` seconds of grading (default: `configure_grading`'s), after which the answer is wrong.

    >>> grade_answer("$1,000.00", "1000"), grade_answer("\\\\frac{3}{4}", "0.75"), grade_answer("72.5", "72")
    (True, True, False)
    """
    return _grade_pairs([(model_answer, ground_truth)], timeout)[0][0]


# ----------------------------------------------------------------------------------------------------
# Reward functions. Each is a RewardFn: call it on one response, or `score_batch` it on many.


def _scores(format_ok: float, right: bool) -> Scores:
    return {"reward": float(right), "format_reward": float(format_ok), "answer_reward": float(right)}


class RewardFn:
    """A reward function `fn(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}`
    that can also grade a batch in parallel (`fn.batch`). Subclasses say where the answer is (`extract`)."""

    name = "reward"

    def extract(self, response: str) -> tuple[float, str | None]:
        """(format_reward, the answer to grade or None when there is none)."""
        raise NotImplementedError

    def plan(self, responses: list[str], ground_truths: list[str]):
        """The (answer, ground truth) pairs to grade, and a function from their verdicts to the scores."""
        extracted = []
        for response in responses:
            try:
                extracted.append(self.extract(response))
            except Exception:  # a bug here must cost one sample its reward, not the run
                extracted.append((0.0, None))
        pairs = [(a, g) for (_, a), g in zip(extracted, ground_truths) if a is not None]

        def finish(verdicts: list[bool]) -> list[Scores]:
            it = iter(verdicts)
            return [_scores(f, a is not None and next(it)) for f, a in extracted]

        return pairs, finish

    def __call__(self, response: str, ground_truth: str) -> Scores:
        return self.batch([response], [ground_truth])[0][0]

    def batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> tuple[list[Scores], dict]:
        return score_batch(self, responses, ground_truths)

    def __repr__(self) -> str:
        return f"<reward fn {self.name}>"


def _unbox(answer: str) -> str | None:
    """The answer with \\boxed{} unwrapped when present; None when the box is unbalanced."""
    if "\\boxed" in answer or "\\fbox" in answer:
        return extract_boxed(answer)
    return answer


class R1ZeroReward(RewardFn):
    """The r1_zero contract: the response (which begins inside the think block) must contain
    "</think> <answer>" and then "</answer>"; the answer is the last complete <answer> block.

    >>> r1_zero_reward_fn(" 48/2 = 24, 48+24 = 72 </think> <answer> 72 </answer>", "72")
    {'reward': 1.0, 'format_reward': 1.0, 'answer_reward': 1.0}
    >>> r1_zero_reward_fn(" so 70 </think> <answer> \\\\boxed{70} </answer>", "72")["format_reward"]
    1.0
    >>> r1_zero_reward_fn(" <answer> 72 </answer> </think>", "72")  # answer inside the think block
    {'reward': 0.0, 'format_reward': 0.0, 'answer_reward': 0.0}
    """

    name = "r1_zero"

    def extract(self, response: str) -> tuple[float, str | None]:
        response = _as_text(response)
        start = response.find("</think> <answer>")
        if start < 0 or response.find("</answer>", start) < 0:
            return 0.0, None
        end = response.rfind("</answer>")
        answer = response[response.rfind("<answer>", 0, end) + len("<answer>") : end]
        return 1.0, _unbox(answer)


class QuestionOnlyReward(RewardFn):
    """The question_only contract: the answer is the last \\boxed{}; format_reward 1 iff there is one.

    >>> question_only_reward_fn("Half of 48 is 24, so 48 + 24 = \\\\boxed{72}.", "72")["reward"]
    1.0
    """

    name = "question_only"

    def extract(self, response: str) -> tuple[float, str | None]:
        answer = extract_boxed(response)
        return (0.0, None) if answer is None else (1.0, answer)


_OPEN_TAG = re.compile(r"<\s*answer\s*>", re.I)
_CLOSE_TAG = re.compile(r"<\s*/\s*answer\s*>", re.I)


class AnswerTagReward(RewardFn):
    """Lenient, for chat prompts: the answer is the last <answer>...</answer> block (any case, spaces
    inside the tags), no think block needed; \\boxed{} inside it is unwrapped.

    >>> answer_tag_reward_fn("So 72 clips.\\n< ANSWER >72</answer >", "72")["reward"]
    1.0
    """

    name = "answer_tag"

    def extract(self, response: str) -> tuple[float, str | None]:
        response = _as_text(response)
        close = None
        for close in _CLOSE_TAG.finditer(response):
            pass
        if close is None:
            return 0.0, None
        opened = None
        for opened in _OPEN_TAG.finditer(response, 0, close.start()):
            pass
        if opened is None:
            return 0.0, None
        return 1.0, _unbox(response[opened.end() : close.start()])


class FormatReward(RewardFn):
    """Another reward function's format_reward as the reward: a format bonus, with no grading."""

    def __init__(self, base: RewardFn):
        self.base, self.name = base, f"format/{base.name}"

    def extract(self, response: str) -> tuple[float, str | None]:
        return self.base.extract(response)[0], None

    def plan(self, responses, ground_truths):
        formats = []
        for response in responses:
            try:
                formats.append(float(self.base.extract(response)[0]))
            except Exception:
                formats.append(0.0)
        return [], lambda _: [{"reward": f, "format_reward": f, "answer_reward": 0.0} for f in formats]


class CombinedReward(RewardFn):
    """A weighted sum of reward functions; see `combine_rewards`."""

    def __init__(self, components: list[tuple[str, Callable, float]]):
        self.components = components
        self.name = "+".join(name for name, _, _ in components)

    def plan(self, responses, ground_truths):
        parts = []  # (name, weight, first pair index, pair count, finish) per component
        pairs: list[tuple[str, str]] = []
        for name, fn, weight in self.components:
            if isinstance(fn, RewardFn):
                sub_pairs, finish = fn.plan(responses, ground_truths)
            else:  # a user's plain callable: no batch support, called one by one
                done = [fn(r, g) for r, g in zip(responses, ground_truths)]
                sub_pairs, finish = [], lambda _, done=done: done
            parts.append((name, weight, len(pairs), len(sub_pairs), finish))
            pairs.extend(sub_pairs)

        def finish_all(verdicts: list[bool]) -> list[Scores]:
            results = [(name, w, finish(verdicts[i : i + n])) for name, w, i, n, finish in parts]
            out = []
            for k in range(len(responses)):
                first = results[0][2][k]
                row = {
                    "reward": sum(w * float(scores[k]["reward"]) for _, w, scores in results),
                    "format_reward": float(first["format_reward"]),
                    "answer_reward": float(first["answer_reward"]),
                }
                row.update({f"reward/{name}": float(scores[k]["reward"]) for name, _, scores in results})
                out.append(row)
            return out

        return pairs, finish_all


def combine_rewards(components: list[tuple[str, Callable, float]]) -> RewardFn:
    """A reward function that is the weighted sum of others (seed 002: correctness plus a format bonus).

    `reward` is sum(weight * component reward); `format_reward` and `answer_reward` come from the first
    component; `reward/<name>` is each component's unweighted reward.

    >>> fn = combine_rewards([("correct", r1_zero_reward_fn, 1.0), ("format", format_reward_fn(), 0.2)])
    >>> fn(" 70 </think> <answer> 70 </answer>", "72")
    {'reward': 0.2, 'format_reward': 1.0, 'answer_reward': 0.0, 'reward/correct': 0.0, 'reward/format': 1.0}
    """
    components = list(components)
    if not components:
        raise ValueError("combine_rewards: needs at least one (name, reward_fn, weight) component")
    checked = []
    for item in components:
        if not (isinstance(item, tuple) and len(item) == 3):
            raise ValueError(f"combine_rewards: each component is (name, reward_fn, weight); got {item!r}")
        name, fn, weight = item
        if not isinstance(name, str) or not name or not callable(fn):
            raise ValueError(f"combine_rewards: component {item!r} needs a non-empty name and a callable")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"combine_rewards: weight of {name!r} must be a finite number; got {weight!r}")
        checked.append((name, fn, float(weight)))
    names = [name for name, _, _ in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"combine_rewards: component names must be distinct; got {names}")
    return CombinedReward(checked)


def format_reward_fn(base: RewardFn | str = "r1_zero") -> RewardFn:
    """A reward function whose reward is `base`'s format_reward (a format bonus for `combine_rewards`).

    >>> format_reward_fn("answer_tag")("<answer> 7 </answer>", "72")
    {'reward': 1.0, 'format_reward': 1.0, 'answer_reward': 0.0}
    """
    base = get_reward_fn(base) if isinstance(base, str) else base
    if not isinstance(base, RewardFn) or isinstance(base, (CombinedReward, FormatReward)):
        raise ValueError(f"format_reward_fn: base must be one of {sorted(REWARD_FNS)} or a RewardFn; got {base!r}")
    return FormatReward(base)


r1_zero_reward_fn = R1ZeroReward()
question_only_reward_fn = QuestionOnlyReward()
answer_tag_reward_fn = AnswerTagReward()

REWARD_FNS: dict[str, RewardFn] = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
    "answer_tag": answer_tag_reward_fn,
}


def get_reward_fn(name: str) -> RewardFn:
    """The built-in reward function of that name (a key of REWARD_FNS)."""
    try:
        return REWARD_FNS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reward function {name!r}; valid: {', '.join(sorted(REWARD_FNS))}") from None


# ----------------------------------------------------------------------------------------------------
# Scoring a batch of rollouts.


def score_batch(
    reward_fn: Callable[[str, str], Scores], responses: Sequence[str], ground_truths: Sequence[str]
) -> tuple[list[Scores], dict]:
    """Score many responses at once: the same dicts as calling `reward_fn` one by one, but the slow-path
    gradings of a RewardFn run concurrently in the pool. A plain callable is called one by one.

    Metadata: "grading/<count>" for the counts of `grading_stats` in this batch, and "grading/seconds".

    >>> scores, meta = score_batch(r1_zero_reward_fn, [" </think> <answer> $72 </answer>", "72"], ["72", "72"])
    >>> [s["reward"] for s in scores], meta["grading/fast_path"], meta["grading/slow_path"]
    ([1.0, 0.0], 1, 0)
    """
    responses, ground_truths = list(responses), list(ground_truths)
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"score_batch: responses ({len(responses)}) and ground_truths ({len(ground_truths)}) differ in length"
        )
    responses = [_as_text(r) for r in responses]
    ground_truths = [_as_text(g) for g in ground_truths]
    if isinstance(reward_fn, RewardFn):
        pairs, finish = reward_fn.plan(responses, ground_truths)
        verdicts, counts = _grade_pairs(pairs)
        scores = finish(verdicts)
    else:
        start, before = time.perf_counter(), grading_stats()
        scores = [reward_fn(r, g) for r, g in zip(responses, ground_truths)]
        after = grading_stats()
        counts = {key: after[key] - before[key] for key in _STAT_KEYS}
        counts["seconds"] = time.perf_counter() - start
    return scores, {f"grading/{key}": value for key, value in counts.items()}


def compute_rollout_rewards(
    reward_fn: Callable[[str, str], Scores],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
):
    """Raw rewards of a rollout batch (seed 004 §4.2.3), and metadata to log.

    Returns `raw_rewards`, float32 of shape (rollout_batch_size,), and a dict with the mean of every score
    the reward function returns (`reward_mean`, `format_reward_mean`, `answer_reward_mean`, and
    `reward/<name>_mean` for combined rewards; 0.0 for an empty batch) plus the "grading/*" counts.

    >>> raw, meta = compute_rollout_rewards(r1_zero_reward_fn, [" </think> <answer> 3 </answer>", " 3"], ["3", "3"])
    >>> raw.tolist(), meta["reward_mean"], meta["format_reward_mean"]
    ([1.0, 0.0], 0.5, 0.5)
    """
    if len(rollout_responses) != len(repeated_ground_truths):
        raise ValueError(
            f"compute_rollout_rewards: rollout_responses ({len(rollout_responses)}) and repeated_ground_truths "
            f"({len(repeated_ground_truths)}) must have the same length"
        )
    scores, grading = score_batch(reward_fn, rollout_responses, repeated_ground_truths)
    return rewards_and_metadata(scores, grading)


def rewards_and_metadata(scores: list[Scores], grading: dict) -> tuple:
    """The raw-reward tensor and the metadata of `compute_rollout_rewards`, from `score_batch`'s output."""
    import torch

    raw_rewards = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)
    keys = list(dict.fromkeys(["reward", "format_reward", "answer_reward"] + [k for s in scores for k in s]))
    metadata: dict[str, float] = {}
    for key in keys:
        values = [float(s[key]) for s in scores if isinstance(s.get(key), (int, float))]
        metadata[f"{key}_mean"] = sum(values) / len(values) if values else 0.0
    metadata.update({key: float(value) for key, value in grading.items()})
    return raw_rewards, metadata
