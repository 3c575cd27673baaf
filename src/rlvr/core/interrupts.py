"""User code called from deep inside a loop (a reward function, an agent) on a leash: `call_bounded` runs it in a
thread of its own, so that a call that never returns costs a timeout, not the run, and a stop signal (Ctrl-C,
a scheduler's SIGTERM) is heard while it runs; and its SystemExit is an error like any other, not the end of the
process. The loops' signal handler (rlvr.stages.run.StopRequests) sets the flag this module reads.

A thread cannot be killed: a call given up on keeps running in its daemon thread until it returns or the
process ends. What it returns then is dropped.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")
_stop = threading.Event()
# a call still running when a stop is asked for gets this long to finish before it is given up on: a slow judge
# in the middle of its answer finishes its step, one that hangs does not hold the stop
STOP_GRACE_S = 5.0


class CallTimedOut(TimeoutError):
    """User code that did not return within its bound."""


class CallAbandoned(Exception):
    """User code still running when a stop was asked for, given up on so that the run can stop."""


def request_stop() -> None:
    _stop.set()


def clear_stop() -> None:
    _stop.clear()


def stop_requested() -> bool:
    return _stop.is_set()


def call_bounded(fn: Callable[[], T], timeout: float | None, what: str, setting: str = "") -> T:
    """fn() in a daemon thread, waited for at most `timeout` seconds (None: no bound, still stoppable). Returns
    its result or raises its exception (a SystemExit as a RuntimeError that says so); CallTimedOut past the
    bound, CallAbandoned when a stop was asked for and the call did not finish within STOP_GRACE_S. `what`
    names the call in the messages ("reward function 'f' on the batch"), `setting` the field that sets the
    bound ("reward_timeout")."""
    box: dict = {}
    done = threading.Event()

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 -- SystemExit and all: the caller decides
            box["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, name=f"rlvr: {what}", daemon=True).start()
    start, stop_seen = time.monotonic(), None
    while not done.wait(0.05):
        now = time.monotonic()
        if timeout is not None and now - start > timeout:
            bound = f" ({setting}={timeout:g})" if setting else ""
            raise CallTimedOut(f"{what} did not return within {timeout:g} s{bound}; it was given up on (its "
                               "thread is left running)")
        if stop_requested():
            stop_seen = stop_seen or now
            if now - stop_seen > STOP_GRACE_S:
                raise CallAbandoned(f"{what} was still running {now - start:.0f} s in when the run was asked to "
                                    "stop; it was given up on")
    if "error" in box:
        err = box["error"]
        if isinstance(err, SystemExit):
            raise RuntimeError(f"{what} called sys.exit({err.code!r})") from None
        if isinstance(err, KeyboardInterrupt):
            raise RuntimeError(f"{what} raised KeyboardInterrupt") from None
        raise err
    return box["value"]
