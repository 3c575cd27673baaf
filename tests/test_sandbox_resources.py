"""The sandbox's bounds (issue 58), as root and as uid 65534: memory that no rlimit counts stays within the
documented budget, one program cannot change the verdict of another graded beside it (in the same grader or
in a second grader process on the machine), and nothing a sandbox leaves outlives it.

Each scenario of `tests/sandbox_resource_attacks.py` runs in a grader process of its own, started (as root, or
as uid 65534 with `setpriv`) in a fresh memory cgroup of this test's, whose peak is the host memory the grader
and all its sandboxes held: what "host memory during an attack" means here, measured by the kernel.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import sandbox_resource_attacks as attacks
from rlvr.sandbox import cgroups
from rlvr.sandbox.uids import holder_pids
from sandbox_site import readable_site
from rlvr.sandbox.records import SandboxLimits, sandbox_memory_mb

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0
SRC = Path(cgroups.__file__).parents[2]
USERS = ["root", "nobody"] if ROOT else ["user"]
# small sandboxes, so that the budget is small against what the attacks try to hold (2 GB each)
LIMITS = {"timeout": 6, "cpu_seconds": 1.5, "memory_mb": 96, "file_mb": 8, "processes": 4, "output_kb": 64}
WORKERS = 4
GRADER_MB = 200
# without cgroups, a sandbox of more processes than its limit is stopped as "memory" (only a cgroup would bound
# their memory), a fork bomb or setsid() spinners among them
STOPPED_WITHOUT_CGROUPS = {"timeout", "memory"}  # the grader process itself (Python and rlvr's sandbox modules) and the page cache it touches
_names = itertools.count()


def _own_memory_cgroup() -> str | None:
    own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
    if "memory" in own and os.path.isdir("/sys/fs/cgroup/memory"):
        return "/sys/fs/cgroup/memory" + own["memory"].rstrip("/")
    if "" in own and "memory" in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split():
        return "/sys/fs/cgroup" + own[""].rstrip("/")
    return None


class Measured:
    """A fresh memory cgroup below this test's own, for one grader process: its peak, and a safety limit so
    that a broken bound cannot take the machine's memory."""

    def __init__(self, limit_mb: int):
        base = _own_memory_cgroup()
        self.path = f"{base}/rlvr-test-{os.getpid()}-{next(_names)}"
        os.mkdir(self.path)
        self.v1 = os.path.exists(f"{self.path}/memory.limit_in_bytes")
        self._write("memory.limit_in_bytes" if self.v1 else "memory.max", str(limit_mb << 20))

    def _write(self, name: str, text: str):
        with open(f"{self.path}/{name}", "w") as f:
            f.write(text)

    def wrap(self, argv: list[str]) -> list[str]:
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.path, *argv]

    def peak_mb(self) -> float:
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        return int(Path(f"{self.path}/{name}").read_text()) / (1 << 20)

    def close(self):
        for _ in range(500):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.01)


def _skip_reason(user: str) -> str | None:
    if not ROOT:
        return "measuring a grader's memory needs a cgroup of its own: root"
    base = _own_memory_cgroup()
    if base is None:
        return "no memory cgroup controller on this machine"
    try:
        os.mkdir(f"{base}/rlvr-test-probe-{os.getpid()}")
        os.rmdir(f"{base}/rlvr-test-probe-{os.getpid()}")
    except OSError as err:
        return f"cannot make a memory cgroup to measure a grader in ({err})"
    if user == "nobody" and (shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON)):
        return f"needs setpriv and {SYSTEM_PYTHON} to run a grader as uid {NOBODY}"
    return None


def _readable_copy(tmp: Path) -> tuple[Path, Path]:
    """(PYTHONPATH dir, attack script) copied into `tmp`, which uid 65534 can read (tests/sandbox_site.py)."""
    where = readable_site(tmp / "site", (Path(attacks.__file__),))
    return where, where / Path(attacks.__file__).name


# a grader as a second container on the same kernel would run it: its own /run (where sandbox uids were once
# locked) and /tmp, the same uids
CONTAINER = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs tmpfs /run && exec "$@"', "sh"]
# a grader that sees every cgroup file system read-only, as a Docker container does by default
READ_ONLY_CGROUPS = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     'for m in $(awk \'$3 ~ /^cgroup/ {print $2}\' /proc/self/mounts); do '
                     'mount -o remount,bind,ro "$m" || exit 9; done; exec "$@"', "sh"]


def grader(user: str, scenario: str, settings: dict, tmp: Path, limit_mb: int = 8192, wait: bool = True,
           within: list[str] = ()):
    """Start `scenario` in a grader process as `user`, in a fresh measured cgroup (and `within` a wrapper that
    runs it in namespaces of its own): (Popen, Measured)."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o777)
    config = tmp / f"{scenario}-{next(_names)}.json"
    config.write_text(json.dumps(settings))
    os.chmod(config, 0o644)
    python = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable
    site, script = _readable_copy(tmp)
    argv = [python, str(script), scenario, str(config)]
    if user == "nobody":
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    argv = [*within, *argv]
    measured = Measured(limit_mb)
    env = {"PATH": settings.get("path", os.environ.get("PATH", "/usr/bin:/bin")), "HOME": str(tmp),
           "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(measured.wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp, env=env)
    return proc, measured


def finish(proc: subprocess.Popen, measured: Measured, timeout: float = 120) -> tuple[dict, float]:
    try:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1]), measured.peak_mb()
    finally:
        measured.close()


def run(user: str, scenario: str, settings: dict, tmp: Path, limit_mb: int = 8192, within: list[str] = ()
        ) -> tuple[dict, float]:
    return finish(*grader(user, scenario, settings, tmp, limit_mb, within=within))


@pytest.fixture(params=USERS)
def user(request):
    why = _skip_reason(request.param)
    if why:
        pytest.skip(why)
    return request.param


@pytest.fixture
def tmp_path():
    """A directory uid 65534 can use too (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="rlvr-resources-", dir="/tmp"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------
# Memory.


def test_memory_no_rlimit_counts_stays_within_the_documented_budget(user, tmp_path):
    budget = WORKERS * sandbox_memory_mb(SandboxLimits(**LIMITS))  # 4 x (4 x 96 + 256 + 16) = 2624 MB
    limits = {**LIMITS, "cpu_seconds": 3, "timeout": 9}  # time enough to hold 2 GB where nothing stops it
    report, peak = run(user, "memory", {"limits": limits, "workers": WORKERS}, tmp_path,
                       limit_mb=budget + GRADER_MB + 1024)
    held = {name: a["held"] for name, a in report["attacks"].items()}
    # each attack tried to hold 2 GB; the kernel's count of everything the grader and its sandboxes held
    assert peak < budget + GRADER_MB, (peak, held)
    for name, attack in report["attacks"].items():
        assert attack["held"] is None or int(attack["held"]) < sandbox_memory_mb(SandboxLimits(**LIMITS)), name
    # the kinds of memory no process's address space counts are refused outright
    for name in ("sysv_shared_memory", "sysv_shared_memory_2", "sysv_message_queues", "posix_message_queues",
                 "memfd_files", "loopback_socket_buffers", "posix_timers", "aio_contexts", "inotify_instances"):
        assert report["attacks"][name]["held"] == "0", (name, report["attacks"][name])
    assert int(report["attacks"]["tmpfs_files"]["held"]) <= 3 * LIMITS["file_mb"]  # /work and /dev/shm
    assert report["attacks"]["tmpfs_inodes"]["status"] == "memory"  # past one file per KB of its tmpfs
    assert int(report["attacks"]["big_pipes_in_children"]["held"]) <= 3 * 64 * 64 // 1024  # 64 KB pipes only
    expected = "cgroup v" if user == "root" and cgroups.in_force() else "no cgroups"  # v1 here and in CI
    assert report["bounds"].startswith(expected), report["bounds"]


# ----------------------------------------------------------------------------------------------------
# Neighbours.


def test_a_verdict_does_not_depend_on_what_runs_beside_it(user, tmp_path):
    """Two grader processes started at once: one grades a fork bomb, two sandboxes of setsid() spinners and
    one of spinning threads, then honest programs; the other, while those attacks run, honest programs only.
    Every honest program (about 1 s of CPU, in a child process) must get its right answer, on 2 CPUs shared by
    8 sandboxes of 8 processes at once and whatever else the machine runs. Before issue 58, as root the second
    grader's programs lost their process slots to the fork bomb (the same uids); as an ordinary user the
    spinners' sessions starved them to 2 x the wall time (5.5 s here, under a load of 22, against 2.6 s)."""
    ready = tmp_path / "ready"
    ready.mkdir(parents=True)
    os.chmod(ready, 0o777)
    common = {"limits": {**LIMITS, "processes": 8, "cpu_seconds": 2, "timeout": 5}, "workers": WORKERS}
    first = grader(user, "neighbours", {**common, "attack": True, "honest": 2, "ready": str(ready / "a")}, tmp_path)
    second = grader(user, "neighbours", {**common, "attack": False, "honest": 4, "ready": str(ready / "b"),
                                         "delay": 0.3}, tmp_path)
    attacked, quiet = finish(*first)[0], finish(*second)[0]
    want = str(attacks.honest_answer())
    for report in (attacked, quiet):
        honest = {n: r for n, r in report["results"].items() if n.startswith("honest")}
        assert all(r["status"] == "ok" and r["value"] == want for r in honest.values()), report
    statuses = {n: r["status"] for n, r in attacked["results"].items() if not n.startswith("honest")}
    assert set(statuses) == {"fork_bomb", "setsid_spinners", "setsid_spinners_2", "spinning_threads"}
    assert set(statuses.values()) == {"timeout"} or (user != "root" and set(statuses.values()) <= STOPPED_WITHOUT_CGROUPS)


def test_a_program_starved_by_another_graders_spinners_is_not_timed_out(user, tmp_path):
    """Another grader process keeps 8 sandboxes spinning on this 2-core machine (each its own CPU share) while
    honest programs that need about half their CPU budget (~1 s of 2) are graded with a wall-clock cap of 2.5 s:
    they get a fifth of a core or less, so they run past the cap. A wall clock that counted the time they waited
    for a CPU would time them out (the grader before issue 64 did, on this machine with these settings: both
    "wall-clock limit" at 2.6 s, where this one answered both at 3.2-3.4 s); here every one gets its answer."""
    ready = tmp_path / "ready"
    ready.mkdir(parents=True)
    os.chmod(ready, 0o777)
    limits = {**LIMITS, "processes": 8, "cpu_seconds": 2, "timeout": 2.5}
    spinning = grader(user, "neighbours", {"limits": {**limits, "timeout": 60}, "workers": 8, "attack": "spin",
                                           "spinners": 8, "honest": 0, "ready": str(ready / "a")}, tmp_path)
    n = attacks.HONEST_N * 3 // 4
    honest = grader(user, "neighbours", {"limits": limits, "workers": 2, "attack": False, "honest": 2, "n": n,
                                         "ready": str(ready / "b"), "delay": 0.5}, tmp_path)
    report = finish(*honest)[0]
    finish(*spinning)
    want = str(attacks.honest_answer(n))
    assert all(r["status"] == "ok" and r["value"] == want for r in report["results"].values()), report


def test_sandbox_uids_are_unique_across_containers(tmp_path):
    """Two graders as two containers on one kernel (each its own /run and /tmp, where lock files would not meet):
    the one grades a fork bomb and spinners, the other honest programs. Their uids are disjoint (the kernel's
    count of a uid's processes decides, host-wide), so the fork bomb takes no process slot of the other's."""
    if not ROOT:
        pytest.skip("sandbox uids are root's (an ordinary user's sandboxes each get a user namespace)")
    ready = tmp_path / "ready"
    ready.mkdir(parents=True)
    os.chmod(ready, 0o777)
    common = {"limits": {**LIMITS, "processes": 8, "cpu_seconds": 2, "timeout": 5}, "workers": WORKERS}
    first = grader("root", "neighbours", {**common, "attack": True, "honest": 2, "ready": str(ready / "a")}, tmp_path,
                   within=CONTAINER)
    second = grader("root", "neighbours", {**common, "attack": False, "honest": 4, "ready": str(ready / "b"),
                                           "delay": 0.3}, tmp_path, within=CONTAINER)
    attacked, quiet = finish(*first)[0], finish(*second)[0]
    assert attacked["uids"] and quiet["uids"] and not set(attacked["uids"]) & set(quiet["uids"])
    want = str(attacks.honest_answer())
    for report in (attacked, quiet):
        honest = {n: r for n, r in report["results"].items() if n.startswith("honest")}
        assert all(r["status"] == "ok" and r["value"] == want for r in honest.values()), report


def test_a_read_only_cgroupfs_is_a_weaker_mode_named_in_every_grading_metric(tmp_path):
    if not ROOT or not cgroups.in_force():
        pytest.skip("needs root where cgroups are in force, to take them away")
    report, _ = run("root", "weaker", {"limits": LIMITS}, tmp_path, within=READ_ONLY_CGROUPS)
    assert report["bounds"].startswith("no cgroups (cannot make a cgroup below") and "Read-only" in report["bounds"]
    assert any("no cgroups here, a weaker mode" in line and "grading/code_no_cgroups" in line for line in report["log"])
    assert report["verdicts"] == [[1, 1], [0, 1]]
    assert report["counts"]["programs"] == report["counts"]["no_cgroups"] == 2


def test_a_user_whose_pipe_pages_are_spent_still_gets_every_answer(user, tmp_path):
    """Five sandboxes hold every pipe their processes may open: as an ordinary user, past the user's pipe budget
    (fs.pipe-user-pages-soft), so that every new pipe of the user, the grader's too, gets the kernel's minimum (two
    pages, not sixteen). Honest
    programs beside them, which send the judge 200 KB, all get their answer: nothing is written to a pipe before
    its reader exists (the job, the seccomp filter: memfds)."""
    limits = {**LIMITS, "processes": 12, "cpu_seconds": 2, "timeout": 20, "wait_seconds": 6}
    report, _ = run(user, "pipes", {"limits": limits, "workers": 7, "hogs": 5, "honest": 4}, tmp_path)
    from rlvr.sandbox import read_value

    assert report["statuses"][5:] == ["ok"] * 4, report
    sizes = [read_value(value)[0] for value in report["values"]]
    assert all(read_value(value)[1] == "x" * 200_000 for value in report["values"])
    if user == "nobody":  # the budget was spent: the honest programs' own pipes had their minimum, not 64 KB
        assert max(sizes) < 65536, sizes


def test_a_program_that_waits_is_stopped_at_its_waiting_bound(user, tmp_path):
    """Sleeping, deadlocked, waiting on an event or on a sleeping child: each is stopped once it has waited
    `wait_seconds` (1 s here), not at the wall-clock cap (30 s here), whose reason would say so."""
    limits = {**LIMITS, "cpu_seconds": 2, "timeout": 30, "wait_seconds": 1}
    report, _ = run(user, "waiting", {"limits": limits, "workers": WORKERS}, tmp_path)
    for name, result in report.items():
        assert result["status"] == "timeout" and result["error"].startswith("waited "), (name, result)


def test_sandbox_uids_are_unique_across_grader_processes(tmp_path):
    if not ROOT:
        pytest.skip("sandbox uids are root's (an ordinary user's sandboxes each get a user namespace)")
    ready = tmp_path / "ready"
    ready.mkdir(parents=True)
    procs = [grader("root", "uids", {"n": 6, "ready": str(ready / name)}, tmp_path) for name in "ab"]
    first, second = (set(finish(*p)[0]["uids"]) for p in procs)
    assert len(first) == len(second) == 6 and not first & second


# ----------------------------------------------------------------------------------------------------
# Leaks.


def test_nothing_a_timed_out_sandbox_left_outlives_it(user, tmp_path):
    """As a container's PID 1 (a subreaper), the grader times out programs that leave processes behind; the
    moment grading returns, no process is left below it (no zombie child either) and none runs as a sandbox
    uid it holds: a uid returns to the pool only with its processes gone."""
    report, _ = run(user, "leftovers", {"limits": {**LIMITS, "timeout": 3}, "workers": WORKERS}, tmp_path)
    assert set(report["statuses"].values()) == {"timeout"} or (
        user != "root" and set(report["statuses"].values()) <= STOPPED_WITHOUT_CGROUPS), report
    assert report["below"] == [] and report["sandbox_uid_processes"] == [], report
    assert len(report["uids"]) == (WORKERS if user == "root" else 0)


NOOP_BWRAP = """#!/usr/bin/env python3
# bubblewrap's interface without its isolation: the fds it is given are honoured, nothing else is
import json, os, sys, tempfile
args, i, block, info = sys.argv[1:], 0, None, None
home = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(__file__)))
while i < len(args) and args[i].startswith("--"):
    name = args[i]
    takes = {"--info-fd": 1, "--block-fd": 1, "--seccomp": 1, "--ro-bind-data": 2, "--ro-bind": 2, "--bind": 2,
             "--dev-bind": 2, "--symlink": 2, "--setenv": 2, "--perms": 1, "--size": 1, "--tmpfs": 1, "--dir": 1,
             "--proc": 1, "--dev": 1, "--remount-ro": 1, "--chdir": 1, "--hostname": 1, "--cap-add": 1,
             "--cap-drop": 1}.get(name, 0)
    values = args[i + 1:i + 1 + takes]
    if name == "--ro-bind" and values[1].startswith("/rlvr/"):  # the harness's package, the sandbox's packages
        where = os.path.join(home, values[1][len("/rlvr/"):])
        os.makedirs(os.path.dirname(where), exist_ok=True)
        os.symlink(values[0], where)
    info = int(values[0]) if name == "--info-fd" else info
    block = int(values[0]) if name == "--block-fd" else block
    i += 1 + takes
command = [a.replace("'/rlvr", repr(home)[:-1]) for a in args[i:]]
pid = os.fork()
if pid == 0:
    os.read(block, 1)
    os.execv(command[0], command)
os.write(info, json.dumps({"child-pid": pid}).encode())
os.close(info)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_every_entry_that_runs_a_program_refuses_a_launcher_that_isolates_nothing(user, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir(parents=True)
    (fake / "bwrap").write_text(NOOP_BWRAP)
    os.chmod(fake, 0o777)  # it writes the harness it is given beside itself
    os.chmod(fake / "bwrap", 0o755)
    report, _ = run(user, "refused", {"path": f"{fake}:/usr/bin:/bin"}, tmp_path)
    for entry, outcome in report.items():
        assert outcome.startswith("refused: the code sandbox cannot isolate programs on this machine"), (entry, outcome)
        assert "weaker than required" in outcome and "seccomp=0" in outcome


# ----------------------------------------------------------------------------------------------------
# The configuration and the run's log.


def test_the_configs_timeout_is_cpu_time_with_a_wall_cap_and_the_log_says_what_bounds_a_sandbox(caplog):
    import rlvr.sandbox as sandbox
    from rlvr.config import TrainConfig, load_config

    saved = sandbox.settings()
    try:
        cfg = load_config(TrainConfig, overrides=["dataset=code", "prompt=code", "sandbox.timeout=2"])
        with caplog.at_level("INFO", logger="rlvr.sandbox"):
            cfg.sandbox.apply()
        limits = sandbox.settings().limits
        assert (limits.cpu_seconds, limits.timeout) == (2, 6)
        line = next(r.getMessage() for r in caplog.records if "bounded by" in r.getMessage())
        assert ("2 s of CPU each (all its processes together; 2 s of waiting; a wall-clock cap of 6 s while not "
                "starved)") in line
        assert ("bounded by cgroup v" if cgroups.in_force() else "bounded by no cgroups") in line
    finally:
        sandbox._settings = saved


def test_a_cgroup_v2_hierarchy_is_used_as_v1_is(tmp_path, monkeypatch):
    """No v2 machine here: a directory stands in for one (the kernel's files as plain files), to check what
    rlvr reads and writes there: it enables the controllers for the groups below its own, gives each sandbox
    memory.max = its budget, no swap, pids.max, and reads its CPU clock and OOM kills from cpu.stat and
    memory.events."""
    own = tmp_path / "user.slice" / "rlvr.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (own / "cgroup.subtree_control").write_text("\n")
    real_read = cgroups._read
    monkeypatch.setattr(cgroups, "_read", lambda path: "0::/user.slice/rlvr.scope\n" if path == "/proc/self/cgroup"
                        else real_read(path))
    monkeypatch.setattr(cgroups, "_mounts", lambda: [("/", str(tmp_path), "cgroup2", {"rw"})])
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777):  # the kernel fills a new group with its files
        real_mkdir(path, mode)
        for name in ("cgroup.procs", "memory.max", "memory.swap.max", "pids.max"):
            Path(path, name).write_text("")
        Path(path, "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
        Path(path, "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert cgroups._own_dirs() == (2, dict.fromkeys(cgroups.V2, str(own)))
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    limits = SandboxLimits(**LIMITS)
    group = cgroups._make(2, dict.fromkeys(cgroups.V2, str(own)), limits)
    where = Path(group.dirs["memory"])
    assert where.parent == own and where.name.startswith(f"rlvr-sandbox-{os.getpid()}-")
    assert (where / "memory.max").read_text() == str(sandbox_memory_mb(limits) << 20)  # 656 MB
    assert (where / "memory.swap.max").read_text() == "0" and (where / "pids.max").read_text() == "20"  # 4 + 16 threads
    assert group.cpu_seconds() == 2.5 and group.oom_killed()
    group.add(4242)
    assert (where / "cgroup.procs").read_text() == "4242"


def test_a_sandbox_its_cgroup_cannot_take_never_runs(monkeypatch):
    """Fail closed: where cgroups are in force and the judge cannot be put in its group, the program never
    starts (it would run without its bounds); the sandbox is stopped, nothing of it is left, and grading stops
    with the reason (SandboxError): the program is not scored 0 for rlvr's failure."""
    if not cgroups.in_force():
        pytest.skip("cgroups are not in force here")
    import rlvr.sandbox as sandbox
    from rlvr.sandbox import Check, Job

    def refuse(self, pid):
        raise OSError(28, "No space left on device")

    sandbox.require()  # probed with its cgroup (a probe that cannot place it refuses to grade at all)
    # this worker's children from before (the grading pool of an earlier test file in the same xdist worker) are
    # not this sandbox's
    before = set(_children())
    monkeypatch.setattr(cgroups.Group, "add", refuse)
    marker = f"/tmp/rlvr-ran-{os.getpid()}"
    with pytest.raises(sandbox.SandboxError, match=r"could not put the sandbox in its cgroup \(\[Errno 28\]"):
        sandbox.run_program(Job(f"open({marker!r}, 'w').close()\ndef f():\n    return 1\n", (Check("f()"),)))
    assert not os.path.exists(marker)  # /tmp is not the sandbox's: a second guard
    assert not set(_children()) - before - set(holder_pids())  # bubblewrap reaped, and its judge by it


def _children() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1]) == os.getpid():
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return out
