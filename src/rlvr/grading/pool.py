"""The slow path: math-verify in a pool of killable worker processes, with a hard time limit per answer.

The workers start from a fork server of this module's own (`_GraderContext`), which preloads only this
module and math_verify and never imports the main script. `configure_grading` sets the time limit and
the pool size, `grading_stats` and `reset_grading_stats` read and zero the counts of every grading, and
`shutdown_grading` stops the pool.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import io
import logging
import math
import multiprocessing
import os
import re
import signal
import threading

# ----------------------------------------------------------------------------------------------------
# The slow path: math-verify in a pool of worker processes, killed at the time limit.

_DEFAULT_TIMEOUT = 1.0
_STARTUP_GRACE_S = 60.0  # a worker that never starts must not hang the caller either
_RESTART_S = 5.0  # allowance per queued task for killing and replacing a timed-out worker

pool_settings = {"timeout": _DEFAULT_TIMEOUT, "max_workers": None}
_pool = None
_pool_pid: int | None = None
_pool_lock = threading.RLock()
STAT_KEYS = ("fast_path", "slow_path", "timeouts", "errors", "too_long", "rejected")
_stats = dict.fromkeys(STAT_KEYS, 0)
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
        if max_workers != pool_settings["max_workers"]:
            shutdown_grading()
        pool_settings.update(timeout=timeout, max_workers=max_workers)


def grading_stats() -> dict[str, int]:
    """Counts since start (or the last reset): gradings by fast and slow path, timeouts, errors, answers
    too long to grade (scored 0 without a look), and answers rejected by the screen (scored 0 as hedged,
    holding a tag, or restating a computation that does not hold; see `rlvr.grading`)."""
    with _stats_lock:
        return dict(_stats)


def reset_grading_stats() -> None:
    with _stats_lock:
        _stats.update(dict.fromkeys(STAT_KEYS, 0))


def count_stats(counts: dict) -> None:
    """Add one call's counts to those of `grading_stats`."""
    with _stats_lock:
        for key in STAT_KEYS:
            _stats[key] += counts[key]


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
            pool.join(timeout=pool_settings["timeout"] + 2)
        except Exception:
            try:
                pool.stop()
                pool.join(timeout=5)
            except Exception:
                pass


def _worker_count() -> int:
    return pool_settings["max_workers"] or os.cpu_count() or 1


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
        if _GraderContext is not None and "forkserver" in multiprocessing.get_all_start_methods():
            context = _GraderContext()
        else:  # no forkserver (Windows): spawn, which re-imports the main script in each worker
            context = multiprocessing.get_context("spawn")
        _pool = ProcessPool(max_workers=_worker_count(), initializer=_worker_init, context=context)
        _pool_pid = os.getpid()
        return _pool


# The grading workers' own start method. A stdlib forkserver or spawn child runs the parent's main script
# again, as __mp_main__, before it unpickles its task: a script without a main guard would train again
# inside the grader. These workers get the preparation data without the main module, from a fork server
# of rlvr's own that preloads only rlvr.grading.pool (this module: the worker functions) and math_verify
# (so replacing a killed worker costs a fork, not a 0.5 s import). The user's own multiprocessing, its
# default forkserver and its preload are untouched.
_server = None
_server_pid: int | None = None
_server_lock = threading.Lock()  # not _pool_lock: pebble's thread starts workers while shutdown holds that


def _grader_server():
    global _server, _server_pid
    with _server_lock:
        if _server is None or _server_pid != os.getpid():  # a forked child needs a server of its own
            from multiprocessing import forkserver

            server = forkserver.ForkServer()
            server.set_forkserver_preload(["rlvr.grading.pool", "math_verify"])
            _server, _server_pid = server, os.getpid()
        return _server


try:
    from multiprocessing import context as _mp_context
    from multiprocessing import popen_forkserver as _mp_popen_forkserver
except ImportError:  # no forkserver on this platform
    _GraderContext = None
else:

    class _GraderPopen(_mp_popen_forkserver.Popen):
        def _launch(self, process_obj):
            # The stdlib's Popen._launch (3.11 to 3.14), with two changes: no main module in the preparation
            # data, and rlvr's fork server instead of the default one.
            from multiprocessing import forkserver, spawn, util

            prep_data = spawn.get_preparation_data(process_obj._name)
            prep_data.pop("init_main_from_name", None)
            prep_data.pop("init_main_from_path", None)
            buf = io.BytesIO()
            _mp_context.set_spawning_popen(self)
            try:
                _mp_context.reduction.dump(prep_data, buf)
                _mp_context.reduction.dump(process_obj, buf)
            finally:
                _mp_context.set_spawning_popen(None)
            self.sentinel, w = _grader_server().connect_to_new_process(self._fds)
            parent_w = os.dup(w)  # the child reads the parent's death from this pipe's other end
            self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)

    class _GraderProcess(_mp_context.ForkServerProcess):
        @staticmethod
        def _Popen(process_obj):
            return _GraderPopen(process_obj)

    class _GraderContext(_mp_context.ForkServerContext):
        Process = _GraderProcess


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


def run_slow(pairs: list[tuple[str, str]], timeout: float, counts: dict) -> list[bool]:
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

