"""The sandbox's records: the limits of one sandbox, the checks a judge runs, a job (a program, its checks and
the runner that runs them), and what comes back (a ProgramResult with one of STATUSES).
"""

from __future__ import annotations

import dataclasses

STATUSES = ("ok", "syntax_error", "load_error", "timeout", "memory", "output_limit", "crashed")
ISOLATIONS = ("bwrap", "limits_only")
RESULT_CAP = 4 << 20  # bytes of the judge's records read from one sandbox
STDERR_CAP = 4096  # bytes of stderr kept (the rest is drained and dropped)


WALL_FACTOR = 3  # the wall-clock cap over the CPU budget (`sandbox.timeout` of the config sets both)
JUDGE_EXTRA_MB = 256  # the judge's address space over memory_mb (room to decode a large value, to import pytest)
RUNNERS = ("script", "unittest", "pytest", "stdio")
OK_OUTCOMES = frozenset({"passed", "skipped", "xfailed", "xpassed"})  # what a runner's run passes with


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. `cpu_seconds` is CPU time of the program: its process and every process it
    starts, together; past it the verdict is `timeout`, so what runs beside a program cannot change its verdict.
    The judge (the tests' own code, pytest, reading the program's values) has a CPU budget of its own,
    `judge_cpu_seconds()`. `wait_seconds` (default: `cpu_seconds`) bounds the time the sandbox spends neither
    running nor waiting for a CPU: a program that sleeps or blocks is stopped there. `timeout` caps the wall
    clock the sandbox may run while it is not starved of CPU by others (`WALL_FACTOR` x the CPU budget from the
    config). `processes` counts the judge and the program's own process too; each may map `memory_mb` (the judge
    `JUDGE_EXTRA_MB` more); `threads` more tasks may be threads (the kernel counts both alike: a sandbox may hold
    `processes + threads` tasks; its cgroup's memory limit still counts `processes`)."""

    timeout: float = 15.0
    cpu_seconds: float = 5.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 8
    output_kb: int = 1024  # stdout + stderr; past this the program is killed
    threads: int = 16
    wait_seconds: float | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "wait_seconds":
                continue
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"SandboxLimits.{field.name} must be > 0; got {value!r}")

    def waits(self) -> float:
        return self.wait_seconds if self.wait_seconds is not None else self.cpu_seconds

    def judge_cpu_seconds(self) -> float:
        """The judge's own CPU budget: pytest's start, the tests' own work, and reading what the program sends."""
        return 2 * self.cpu_seconds + 2


def sandbox_memory_mb(limits: SandboxLimits) -> int:
    """The memory one sandbox may hold in all: every process at its address-space limit, the judge's extra,
    and its tmpfs (2 x file_mb of /work, file_mb of /dev/shm). The cgroup limit where cgroups are in force; the
    budget `rlvr.sandbox` logs."""
    return int(limits.processes * limits.memory_mb + JUDGE_EXTRA_MB + 3 * limits.file_mb)


def work_files(limits: SandboxLimits) -> int:
    """The most files (inodes) a sandbox's tmpfs may hold where no cgroup charges their kernel memory: one per
    KB of its size, so that they cost no more than its size again (/work and /dev/shm together)."""
    return int(3 * limits.file_mb * 1024)


@dataclasses.dataclass(frozen=True)
class Check:
    """One check of the "script" runner, in order with the others in one namespace (the program's names bound
    as handles): `setup` runs first (statements; one that raises stops the file: this check and every later one
    fail), then `expr`. kind "run": `expr` is statements, passing when they complete; "true": an expression,
    passing when truthy; "value": the expression's value is sent back as data (`ProgramResult.values`)."""

    expr: str
    kind: str = "value"
    setup: str = ""
    label: str = ""  # what the check is, as the test wrote it (expr may be rewritten to say what failed)


@dataclasses.dataclass(frozen=True)
class Job:
    """A program and how its tests run. `runner` (RUNNERS): "script" runs `checks`; "unittest" and "pytest"
    run the test file `source` with that runner; "stdio" runs the program as a script on each (stdin, stdout)
    of `cases`, its output compared by `compare` (exact, whitespace, float). `bind` says which names the file
    binds itself and asks of the program (rlvr.grading.code_tests); `patches`: the tests may patch modules
    the program uses (mock, monkeypatch), which are then carried over to the program's process; `forward`:
    what of the program's the tests look at besides its output ("warnings", "logging"), sent to the judge."""

    program: str
    checks: tuple[Check, ...]
    module: str = "solution"  # the program is importable under this name from the test code
    runner: str = "script"
    source: str = ""
    cases: tuple = ()
    compare: str = "whitespace"
    bind: tuple = ()  # (key, value) pairs for the judge's bind()
    patches: bool = False
    forward: tuple = ()


@dataclasses.dataclass
class ProgramResult:
    status: str  # one of STATUSES
    values: list[str | None]  # per check: a "value" check's value, as wire text (None: raised or never reached)
    errors: list[str | None]  # per check: the exception's type name, or None
    seconds: float
    stderr: str = ""
    error: str = ""  # what stopped the program: exception name on load, timeout, signal
    outcomes: list[str | None] = dataclasses.field(default_factory=list)  # per check, the runner's (None: no record)
    reasons: list[str] = dataclasses.field(default_factory=list)  # per check: a line on why it did not pass
    uncrossable: list[str] = dataclasses.field(default_factory=list)  # values that could not cross, by name
    judge_error: str = ""  # the judge's own failure (a bug of rlvr's), if any

    def passed(self) -> list[bool]:
        """Which checks passed, as the runner decided (skipped, xfailed and xpassed pass, as in its exit status)."""
        return [self.status == "ok" and outcome in OK_OUTCOMES for outcome in self.outcomes]
