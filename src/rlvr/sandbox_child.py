"""The sandbox's child: run as a script (`python -S -I -B sandbox_child.py <result fd> <mode>`) inside the new
namespaces `rlvr.sandbox` starts it in. It reads one job from stdin, locks itself in, runs the untrusted
program, and evaluates the test expressions in the program's namespace, writing one line per check to the
result pipe.

Standard library only (it runs with -S: no site-packages), and nothing here decides whether a test passed:
the child sends the values it computed and the parent compares them with expected values the child never
sees, so a program that patches this module, `assert`, `==` or the result pipe can only pass by producing
the right values.

Order, all before the program's first line:
  1. read the job; stdin becomes /dev/null (stdout and stderr are pipes the parent caps)
  2. (namespaces) private mounts; a size-limited tmpfs as the working directory; tmpfs over /root and /home
     with the Python installation bound back read-only; every other mount read-only, nosuid, nodev; a new
     /proc that shows only this sandbox's processes
  3. fork: the program runs in the child; the parent (PID 1 of the namespace) reports how it ended
  4. drop privileges: to a uid of the sandbox's own when started as root; else (in a user namespace) an
     empty capability bounding set and no_new_privs, so nothing can be remounted writable
  5. resource limits: CPU seconds, address space, file size, processes, open files, no core dumps
"""

import ctypes
import json
import os
import resource
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECUREBITS = 24, 38, 28
HIDDEN = ("/root", "/home")

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mounts():
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].replace("\\040", " ") for line in f]


def _lock_in(work: str, file_mb: int):
    """Step 2: the filesystem as the program sees it."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"size={max(file_mb, 1) * 2}m,mode=0777")
    keep = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)})
    staged = []
    for i, path in enumerate(keep):  # the interpreter's own files must stay readable once /root is hidden
        if any(path == h or path.startswith(h + "/") for h in HIDDEN):
            stage = os.path.join(work, f".stage{i}")
            os.mkdir(stage)
            _mount(path, stage, None, MS_BIND | MS_REC)
            staged.append((stage, path))
    for hidden in HIDDEN:
        if os.path.isdir(hidden):
            _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for stage, path in staged:
        os.makedirs(path, exist_ok=True)
        _mount(stage, path, None, MS_BIND | MS_REC)
        _libc.umount2(stage.encode(), MNT_DETACH)
        os.rmdir(stage)
    for target in sorted(set(_mounts()), key=len):
        if target == work or target.startswith("/proc"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        try:
            _mount(None, target, None, flags)
        except OSError:
            _mount(None, target, None, flags | MS_NOEXEC)  # a mount locked noexec must keep the flag
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _drop_privileges(work: str, uid: int):
    """Step 4: as root, a uid of this sandbox's own (so process limits and signals are per sandbox)."""
    if os.geteuid() == 0 and os.getuid() == 0 and _owner_is_host_root():
        os.chown(work, uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    else:  # root of a user namespace (the host user): keep the uid, lose every capability for good
        for cap in range(64):
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        _libc.prctl(PR_SET_SECUREBITS, 0x2F, 0, 0, 0)  # NOROOT, NO_SETUID_FIXUP, and both locked
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _owner_is_host_root() -> bool:
    # inside a user namespace with map-root-user, uid 0 maps to the host user; nobody is unmapped there
    try:
        with open("/proc/self/uid_map") as f:
            first = f.read().split()
        return first[:3] == ["0", "0", "4294967295"]
    except OSError:
        return True


def _limit(limits: dict, isolated: bool):
    """Step 5."""
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    processes = limits["processes"] + (0 if isolated and os.getuid() == limits["uid"] else limits["user_processes"])
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with an error instead


# ----------------------------------------------------------------------------------------------------
# Running the program and the checks. Values go out as repr of exact built-in types only.

_EXACT = (int, float, complex, str, bytes, bool, type(None))


def _encode(value, depth=0, budget=None):
    """repr of a value built only from exact built-in types (no subclasses: an object whose __eq__ says
    yes to everything cannot pass), or None when it is not one."""
    budget = budget if budget is not None else [100_000]
    budget[0] -= 1
    if budget[0] < 0 or depth > 50:
        return None
    kind = type(value)
    if kind in _EXACT:
        text = repr(value)
        return text if len(text) < 1_000_000 else None
    if kind in (list, tuple, set, frozenset):
        parts = [_encode(v, depth + 1, budget) for v in value]
        if any(p is None for p in parts):
            return None
        if kind is list:
            return "[" + ", ".join(parts) + "]"
        if kind is tuple:
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        if not parts:
            return "set()" if kind is set else "frozenset()"
        return ("{" if kind is set else "frozenset({") + ", ".join(sorted(parts)) + ("}" if kind is set else "})")
    if kind is dict:
        items = [(_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    return None


def main():
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    isolated = sys.argv[2] == "isolated"
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    work = job["work"]
    if isolated:
        _lock_in(work, job["limits"]["file_mb"])
    out.write(json.dumps({"ready": True}) + "\n")
    pid = os.fork()
    if pid == 0:
        try:
            if isolated:
                _drop_privileges(work, job["uid"])
            os.chdir(work)
            _limit(job["limits"], isolated)
            _run(job, out.write)
        finally:
            os._exit(0)
    # The monitor (PID 1 of the sandbox, out of the program's reach): how the program ended, then exit,
    # which takes every process left in the namespace with it.
    _, status = os.waitpid(pid, 0)
    signaled = os.WIFSIGNALED(status)
    out.write(json.dumps({"exit": os.WTERMSIG(status) if signaled else os.WEXITSTATUS(status), "signaled": signaled})
              + "\n")


def _run(job: dict, write):
    encode, exact_true = _encode, True
    program, name = job["program"], job.get("module") or "solution"
    try:
        code = compile(program, "solution.py", "exec")
    except BaseException as err:  # SyntaxError, or a MemoryError from a huge program
        write(json.dumps({"load": "syntax_error", "error": type(err).__name__}) + "\n")
        return
    try:
        import types

        module = types.ModuleType(name)
        namespace = module.__dict__
        sys.modules[name] = module  # `from solution import f` in test code works
        exec(code, namespace)
    except BaseException as err:  # SystemExit too: exiting before the tests run is not passing them
        write(json.dumps({"load": "error", "error": type(err).__name__}) + "\n")
        return
    write(json.dumps({"load": "ok"}) + "\n")
    for i, check in enumerate(job["checks"]):
        try:
            if check.get("setup"):
                exec(compile(check["setup"], f"test_{i}.py", "exec"), namespace)
            value = eval(compile(check["expr"], f"test_{i}.py", "eval"), namespace)
            if check["kind"] == "value":
                text = encode(value)
                record = {"check": i, "value": text} if text is not None else {"check": i, "error": "unserializable"}
            else:  # "true": the expression itself must be the True singleton
                record = {"check": i, "value": "True" if value is exact_true else "False"}
        except BaseException as err:
            record = {"check": i, "error": type(err).__name__}
        write(json.dumps(record) + "\n")
    write(json.dumps({"done": True}) + "\n")


if __name__ == "__main__":
    main()
