"""Reading a judge's records back into a ProgramResult, so that no bytes a program can write ever raise here.

The judge writes one JSON line per event (`rlvr.sandbox.inside.harness`, `runners`): {"ready"}, {"load": ok |
syntax_error | error}, {"count": n} where its runner decides how many checks there are (pytest's collection,
unittest's loader), {"check": i, "outcome", "error", "reason", "value"} per check, {"uncrossable": what} for a
value that could not cross, {"internal": why} for a failure of the judge's own, {"exit", "signaled"} if the
program's process ended early, {"broken"} if the judge stopped it, {"done"} when the runner ran to its end.
"""

from __future__ import annotations

import json
import signal

from rlvr.sandbox.records import RESULT_CAP, STDERR_CAP, ProgramResult

MAX_CHECKS = 100_000
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def read_results(raw: bytes, stderr_raw: bytes, returncode: int, killed: str | None, n: int, seconds: float,
                 why: str = "") -> ProgramResult:
    """The judge's records: a line that is not a record of the expected shape is skipped, and what is missing
    makes the status `crashed`. `n` is the number of checks the caller expects, unless the judge counts them;
    `why` is what the caller's stop said (`killed`)."""
    values: list[str | None] = [None] * n
    errors: list[str | None] = [None] * n
    outcomes: list[str | None] = [None] * n
    reasons: list[str] = [""] * n
    uncrossable: list[str] = []
    load = error = exit_record = broken = internal = None
    done = False
    for line in raw[:RESULT_CAP].split(b"\n"):
        if len(line) > 2 * 1_000_000 + 100:  # longer than any record of one value
            continue
        try:
            record = json.loads(line.decode("utf-8", "replace"))
        except Exception:  # ValueError, RecursionError (a deeply nested line), MemoryError
            continue
        if not isinstance(record, dict):
            continue
        if "load" in record and load is None and isinstance(record["load"], str):
            load, error = record["load"], str(record.get("error", ""))[:200]
        elif type(record.get("count")) is int and 0 <= record["count"] <= MAX_CHECKS:
            size = record["count"]
            for column, blank in ((values, None), (errors, None), (outcomes, None), (reasons, "")):
                del column[size:]
                column += [blank] * (size - len(column))
        elif type(record.get("check")) is int and 0 <= record["check"] < len(outcomes):
            i = record["check"]
            if outcomes[i] is None:
                outcome = record.get("outcome")
                outcomes[i] = outcome if outcome in OUTCOMES else "error"
                value = record.get("value")
                values[i] = value if isinstance(value, str) else None
                err = record.get("error")
                errors[i] = str(err)[:200] if err is not None else None
                reasons[i] = str(record.get("reason", ""))[:300]
        elif isinstance(record.get("uncrossable"), str) and len(uncrossable) < 20:
            uncrossable.append(record["uncrossable"][:300])
        elif record.get("done") is True:
            done = True
        elif "exit" in record and type(record["exit"]) is int and exit_record is None:
            exit_record = record
        elif isinstance(record.get("broken"), str):
            broken = record["broken"][:200]
        elif isinstance(record.get("internal"), str):
            internal = record["internal"][:300]
    stderr = stderr_raw.decode("utf-8", "replace")
    if load == "syntax_error":
        status = "syntax_error"
    elif "MemoryError" in (error or "") or "MemoryError" in errors:
        status = "memory"
    elif load == "error":
        status = "load_error"
    elif killed == "memory":
        status, error = "memory", why or "over the sandbox's memory limit"
    elif killed == "output_limit":
        status, error = "output_limit", "wrote more output than allowed"
    elif killed is not None:
        status, error = "timeout", why or "cpu time limit"
    elif broken is not None:
        status, error = "crashed", f"the program broke the judge's protocol ({broken}) and was stopped"
    elif exit_record is not None and exit_record.get("signaled") is True and exit_record["exit"] in (
            signal.SIGXCPU, signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one
        status, error = "timeout", "cpu time limit"
    elif internal is not None:
        status, error = "crashed", f"the judge failed ({internal})"
    elif done and load == "ok" and exit_record is None:
        status, error = "ok", ""
    else:
        status = "crashed"
        if exit_record is not None:
            how = "signal" if exit_record.get("signaled") is True else "exit status"
            error = f"the program's process ended ({how} {exit_record['exit']})"
        elif load is None:
            error = f"the sandbox did not start (exit {returncode})"
        error = error or f"exit status {returncode}"
    return ProgramResult(status, values, errors, seconds, stderr=stderr[-STDERR_CAP:], error=error or "",
                         outcomes=outcomes, reasons=reasons, uncrossable=uncrossable, judge_error=internal or "")
