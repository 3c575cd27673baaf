"""The sandbox's records: the limits of one sandbox, the checks a judge runs, a job (a program and its checks),
and what comes back (a ProgramResult with one of STATUSES).
"""

from __future__ import annotations

import dataclasses

STATUSES = ("ok", "syntax_error", "load_error", "timeout", "memory", "output_limit", "crashed")
ISOLATIONS = ("bwrap", "limits_only")
RESULT_CAP = 4 << 20  # bytes of the judge's records read from one sandbox
STDERR_CAP = 4096  # bytes of stderr kept (the rest is drained and dropped)


WALL_FACTOR = 3  # the wall-clock cap over the CPU budget (`sandbox.timeout` of the config sets both)
JUDGE_EXTRA_MB = 256  # the judge's address space over memory_mb (room to decode a large value: harness.py)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. `cpu_seconds` is CPU time of the whole sandbox (the judge, the program and
    every process it starts, together): past it the verdict is `timeout`, so what runs beside a program cannot
    change its verdict. `timeout` is a generous wall-clock cap for a program that waits instead of computing
    (`WALL_FACTOR` x the CPU budget from the config). `processes` counts the judge and the program's own
    process too; each may map `memory_mb` (the judge `JUDGE_EXTRA_MB` more)."""

    timeout: float = 15.0
    cpu_seconds: float = 5.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 8
    output_kb: int = 1024  # stdout + stderr; past this the program is killed

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"SandboxLimits.{field.name} must be > 0; got {value!r}")


def sandbox_memory_mb(limits: SandboxLimits) -> int:
    """The memory one sandbox may hold in all: every process at its address-space limit, the judge's extra,
    and its tmpfs (2 x file_mb). The cgroup limit where cgroups are in force; the budget `rlvr.sandbox` logs."""
    return int(limits.processes * limits.memory_mb + JUDGE_EXTRA_MB + 2 * limits.file_mb)


def work_files(limits: SandboxLimits) -> int:
    """The most files (inodes) a sandbox's tmpfs may hold where no cgroup charges their kernel memory: one per
    KB of its size, so that they cost no more than its size again."""
    return int(2 * limits.file_mb * 1024)


@dataclasses.dataclass(frozen=True)
class Check:
    """One test, as the judge runs it, in order with the others in one namespace (the program's names bound as
    handles): `setup` runs first (statements; one that raises stops the file: this check and every later one
    fail), then `expr`. kind "value": the expression's value is sent back (compared by the caller, outside);
    "true": its truth value is; "run": `expr` is statements, passing when they complete."""

    expr: str
    kind: str = "value"
    setup: str = ""


@dataclasses.dataclass(frozen=True)
class Job:
    program: str
    checks: tuple[Check, ...]
    module: str = "solution"  # the program is importable under this name from the test code


@dataclasses.dataclass
class ProgramResult:
    status: str  # one of STATUSES
    values: list[str | None]  # per check: the value's text (None: raised, unserializable or never reached)
    errors: list[str | None]  # per check: the exception's type name, or None
    seconds: float
    stderr: str = ""
    error: str = ""  # what stopped the program: exception name on load, timeout, signal
