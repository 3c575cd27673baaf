"""How a sandbox is started: bubblewrap's command line, the seccomp filter, and what this machine lacks.

Why bubblewrap: it is the maintained, audited launcher Flatpak runs every desktop app under, it works for an
ordinary user (through unprivileged user namespaces) and for root, takes a compiled seccomp filter from a file
descriptor, and has no daemon; nsjail needs a build, gVisor's runsc a container runtime. What it is told:

* new PID, network, IPC, UTS and cgroup namespaces (and, for an ordinary user, a user namespace, with
  further user namespaces disabled: `--disable-userns`); the judge is PID 1 (`--as-pid-1`), so when it exits
  the kernel kills every process the program left; `--die-with-parent` and `--new-session`.
* a root of its own: an empty tmpfs holding only, read-only, the Python runtime (its prefix and the shared
  libraries under /usr/lib, /lib, /lib64), the code that runs inside (`rlvr/sandbox/inside`, at /rlvr/inside),
  the few packages a sandbox gets at /rlvr/site (pytest and its dependencies for the judge; numpy where the
  grader has it: `PACKAGES`), a new /proc (bubblewrap keeps /proc/sys read-only), a /dev of null, zero, full,
  random, urandom (no pseudo-terminals) and the CPU count a sandbox shows (/sys/devices/system/cpu/online:
  min(the grader's CPUs, processes - 2), so that `multiprocessing.Pool()` fits its process limit); then `/`
  itself is remounted read-only. Writable: a fresh tmpfs `/work` of 2 x `file_mb` and a /dev/shm of `file_mb`
  of its own (multiprocessing's semaphores). No /home, /root, /tmp, /run, /var, /etc, no project, venv, data
  set, cache or run directory. What bubblewrap reads (the seccomp filter, the CPU count) and the job the judge
  reads come in memfds, never pipes: nothing is written to a pipe before its reader exists.
* its judge's pid reported (`--info-fd`) and the judge held (`--block-fd`) until rlvr has put it in the
  sandbox's cgroup and holds a pidfd on it (`rlvr.sandbox.running`).
* no capabilities: for an ordinary user bubblewrap drops them all; for root it keeps only CAP_SETUID,
  CAP_SETGID and CAP_SETPCAP for the harness's first act, which empties the bounding set and switches to an
  unprivileged uid of the sandbox's own (one per sandbox running: process limits and signals stay per
  sandbox, and the program owns no file of the host). No user namespace is made for root: bubblewrap would
  map its uid to host root, whom the kernel exempts from the process limit (a fork bomb), and the uid of
  our own is what a user namespace would have bought. no_new_privs in both cases.
* the seccomp filter below (`seccomp_filter`): no mount, no namespaces, no tracing, no keyrings, no BPF,
  no perf events, no io_uring or AIO (io_setup takes from the host's one pool), no inotify (a per-user count
  shared with the grader), no kernel modules, no sockets but a unix socketpair (asyncio's, multiprocessing's)
  whose buffers keep their defaults; and nothing else that holds memory no process's address space counts: no
  SysV shared memory, message queues or semaphores, no POSIX message queues, no memfd, no POSIX timers, no pipe
  grown past 64 KB. No setsid(): a sandbox stays one session, one scheduler group.

`probe` starts one real sandbox and reads, from inside, its capabilities, no_new_privs, seccomp mode, uid,
network interfaces and whether a user namespace can still be made; `rlvr.sandbox` refuses to grade unless
every one of them is as above, and says what to install or change.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path

INSIDE_DIR = Path(__file__).with_name("inside")  # bound at /rlvr/inside
INSIDE_ROOT, SITE = "/rlvr", "/rlvr/site"
# the harness's entry: its package on the path, then main(argv)
BOOT = "import sys;sys.path[:0]=[{site!r},{root!r}];from inside.harness import main;main(sys.argv[1:])"
# the packages a sandbox gets (those the grader can import): pytest and its dependencies for the judge, numpy for
# programs; a wheel's bundled libraries (numpy.libs) come with them
PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py", "numpy")
# refused with EPERM: what only a container runtime or a debugger needs, and the kernel's riskiest surface
DENIED = ("mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
          "fspick", "mount_setattr", "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev",
          "pidfd_getfd", "kcmp", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module",
          "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "syslog", "quotactl",
          "open_by_handle_at", "name_to_handle_at", "personality", "lookup_dcookie", "vhangup",
          # memory that no process's address space counts (RLIMIT_AS): SysV shared memory, message queues and
          # semaphores, POSIX message queues, memfd files, POSIX timers (kernel objects, one a call)
          "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
          "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
          "mq_getsetattr", "memfd_create", "memfd_secret", "timer_create",
          # a host-wide pool (fs.aio-max-nr) and a per-user count (fs.inotify.max_user_instances) the grader shares
          "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents", "inotify_init",
          "inotify_init1", "inotify_add_watch", "fanotify_init",
          # a new session is a new scheduler group (autogroup): a sandbox stays one, however many processes
          "setsid")
F_SETPIPE_SZ = 1031  # pipes keep their 64 KB: larger ones are memory outside every rlimit
# clone() flags that make namespaces: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (NEWTIME
# needs clone3 or unshare, both refused)
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
TIOCSTI = 0x5412
AF_UNIX, SOL_SOCKET, SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE = 1, 1, 7, 8, 32, 33


class Unavailable(RuntimeError):
    """The isolation cannot be set up here; the message says what is missing and how to get it."""


@lru_cache(maxsize=None)
def seccomp_filter() -> bytes:
    """The compiled BPF program bubblewrap loads (`--seccomp`) before the harness's first instruction."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as err:  # the binding, or libseccomp.so.2 under it
        raise Unavailable(f"no seccomp library ({err}): install libseccomp (Debian/Ubuntu: apt-get install "
                          "libseccomp2) and the binding (pip install pyseccomp)") from None
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            rules.add_rule(deny, name)
        except (OSError, ValueError, RuntimeError):  # a syscall this kernel/libseccomp does not know
            pass
    for flag in NAMESPACE_FLAGS:  # clone() with any of them: libseccomp takes one masked compare a rule
        rules.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags sit behind a pointer: glibc falls back to clone
    # no socket of any family: unix ones reach the host, and the buffers of internet ones on the loopback are
    # memory outside every rlimit (tests need no network; the namespace has none anyway). A connected unix pair
    # reaches nothing (asyncio's self-pipe, multiprocessing.Pipe); its buffers keep their default size
    rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket")
    rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socketpair", seccomp.Arg(0, seccomp.NE, AF_UNIX))
    for option in (SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE):
        rules.add_rule(deny, "setsockopt", seccomp.Arg(1, seccomp.EQ, SOL_SOCKET), seccomp.Arg(2, seccomp.EQ, option))
    rules.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    rules.add_rule(deny, "fcntl", seccomp.Arg(1, seccomp.EQ, F_SETPIPE_SZ))
    fd = os.memfd_create("rlvr-seccomp")
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            rules.export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
        return data
    finally:
        os.close(fd)


def data_fd(data: bytes, name: str = "rlvr") -> int:
    """A memfd holding `data`, positioned at its start, for bubblewrap or the judge to read (a pipe written
    before its reader exists can block forever once the user's pipe pages run short)."""
    fd = os.memfd_create(name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


@lru_cache(maxsize=None)
def precompile() -> bool:
    """Byte-compile the code that runs inside once, where its directory is writable: every sandbox then loads
    it from .pyc instead of compiling ~1,500 lines (tens of ms of CPU per sandbox). Whether it could."""
    import compileall

    try:
        return bool(compileall.compile_dir(str(INSIDE_DIR), quiet=2, maxlevels=0))
    except OSError:  # a read-only install: its .pyc came with it, or each sandbox compiles
        return False


@lru_cache(maxsize=None)
def packages() -> tuple[tuple[str, str], ...]:
    """(name under /rlvr/site, host path) of each package a sandbox gets, where the grader can import it."""
    import importlib.util

    out = []
    for name in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            path = os.path.realpath(list(spec.submodule_search_locations)[0])
            out.append((name, path))
            libs = f"{path}.libs"  # a wheel's bundled shared libraries, found by $ORIGIN/../numpy.libs
            if os.path.isdir(libs):
                out.append((f"{name}.libs", libs))
        elif spec.origin and os.path.isfile(spec.origin):
            out.append((os.path.basename(spec.origin), os.path.realpath(spec.origin)))
    return tuple(out)


def cpus_shown(processes: int) -> int:
    """The CPUs a sandbox reports (os.cpu_count(), multiprocessing.Pool()'s default): its own processes must fit
    a pool of that many, beside the judge and the program's main process."""
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = os.cpu_count() or 1
    return max(1, min(mine, processes - 2))


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def interpreter() -> tuple[str, list[str]]:
    """(python binary, directories it needs) of the base interpreter (a venv's own python is a link to it)."""
    binary = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    needed = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    return binary, sorted(needed)


def _system_dirs() -> list[tuple[str, str]]:
    """("bind" | "link", path) for the shared-library directories: merged-/usr symlinks stay symlinks."""
    out = []
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32"):
        if os.path.islink(path):
            out.append(("link", path))
        elif os.path.isdir(path):
            out.append(("bind", path))
    return out


def bwrap_argv(root: bool, work_mb: int, shm_mb: int, seccomp_fd: int, cpus_fd: int, info_fd: int,
               block_fd: int) -> list[str]:
    """bubblewrap's command line for one sandbox, up to the interpreter it starts (the caller adds the harness's
    flags and arguments). bubblewrap reads the seccomp filter and the CPU count from two memfds, writes the
    judge's pid to `info_fd` and holds the judge, set up but before its first instruction, until `block_fd` is
    written."""
    binary, prefixes = interpreter()
    argv = [bwrap_path() or "bwrap", "--info-fd", str(info_fd), "--block-fd", str(block_fd)]
    if root:
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    argv += ["--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox", "--clearenv"]
    for name, value in ENVIRONMENT:
        argv += ["--setenv", name, value]
    covered: list[str] = []
    made: set[str] = set()

    def parents(path: str) -> list[str]:  # made 0755 first: bubblewrap would copy the host's modes (/root 0700)
        out = []
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                made.add(parent)
                out += ["--perms", "0755", "--dir", parent]
        return out

    for kind, path in _system_dirs():
        argv += parents(path)
        if kind == "link":
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind", path, path]
            covered.append(path)
    for path in prefixes:
        if not any(path == c or path.startswith(c + "/") for c in covered):
            argv += [*parents(path), "--ro-bind", path, path]
            covered.append(path)
    if not any(binary.startswith(c + "/") for c in covered):
        argv += [*parents(binary), "--ro-bind", binary, binary]
    argv += [*parents(f"{INSIDE_ROOT}/inside"), "--ro-bind", str(INSIDE_DIR), f"{INSIDE_ROOT}/inside"]
    argv += ["--perms", "0755", "--dir", SITE]
    for name, path in packages():
        argv += ["--ro-bind", path, f"{SITE}/{name}"]
    argv += ["--proc", "/proc", *_devices(), *parents("/sys/devices/system/cpu/online"),
             "--ro-bind-data", str(cpus_fd), "/sys/devices/system/cpu/online",
             "--perms", "1777", "--size", str(shm_mb << 20), "--tmpfs", "/dev/shm",
             "--perms", "1777", "--size", str(work_mb << 20), "--tmpfs", "/work",
             "--remount-ro", "/", "--chdir", "/work", "--seccomp", str(seccomp_fd), binary]
    return argv


# the sandbox's whole environment: a fixed hash seed (set order, and so verdicts, repeat); one thread for the
# numeric libraries (a thread per host CPU would not fit the sandbox's process limit); no pytest plugins from
# entry points
ENVIRONMENT = (("PATH", "/usr/bin:/bin"), ("HOME", "/work"), ("TMPDIR", "/work"), ("LANG", "C.UTF-8"),
               ("PYTHONHASHSEED", "0"), ("OMP_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1"),
               ("MKL_NUM_THREADS", "1"), ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1"))


def _devices() -> list[str]:
    """/dev: the five harmless devices and the fd links, on the read-only root (and the caller's /dev/shm). Not
    bubblewrap's `--dev`, which also mounts a devpts: pseudo-terminals are kernel memory (and a host-wide count)
    a program could exhaust."""
    out = ["--perms", "0755", "--dir", "/dev"]
    for name in ("null", "zero", "full", "random", "urandom"):
        out += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        out += ["--symlink", target, f"/dev/{name}"]
    return out


def python_flags() -> list[str]:
    # -S no site-packages, -s no user site, -P no script directory on sys.path, -B no .pyc written.
    # Not -I: its -E would ignore PYTHONHASHSEED; the environment is ours alone (--clearenv) anyway.
    return ["-S", "-s", "-P", "-B"]


def boot(isolated: bool) -> list[str]:
    """The interpreter's arguments that start the harness: inside the sandbox from /rlvr, else from here."""
    if isolated:
        return ["-c", BOOT.format(site=SITE, root=INSIDE_ROOT)]
    site = sorted({os.path.dirname(path) for _, path in packages()})
    code = BOOT.replace("sys.path[:0]=[{site!r},{root!r}]", "sys.path[:0]=[*{site!r},{root!r}]")
    return ["-c", code.format(site=site, root=str(INSIDE_DIR.parent))]


# ----------------------------------------------------------------------------------------------------
# Saying what is missing, in the user's terms.

_USER_HELP = (
    "unprivileged user namespaces must be allowed: `sysctl kernel.unprivileged_userns_clone=1` (Debian before 11), "
    "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap (Ubuntu 23.10 and "
    "later), `sysctl user.max_user_namespaces=15000` (RHEL); inside a container, also the container's options below")
_CONTAINER_HELP = (
    "a container must be allowed to make namespaces: Docker/Podman `--security-opt seccomp=unconfined "
    "--security-opt apparmor=unconfined` (or `--cap-add SYS_ADMIN`, or `--privileged`), Kubernetes "
    "`securityContext: {capabilities: {add: [SYS_ADMIN]}, seccompProfile: {type: Unconfined}}`")


def diagnose(stderr: str, root: bool) -> str:
    """What to do about a sandbox that failed to start, from bubblewrap's own message."""
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    lowered = stderr.lower()
    if any(s in lowered for s in ("namespace", "uid map", "setting up uid", "operation not permitted",
                                  "permission denied", "no permissions")):
        help_ = _CONTAINER_HELP if root else f"{_USER_HELP}; {_CONTAINER_HELP}"
        return f"bubblewrap could not start a sandbox ({text}): the kernel refused to create namespaces; {help_}"
    return f"bubblewrap could not start a sandbox ({text})"


MISSING_BWRAP = ("bubblewrap (`bwrap`) is not installed: Debian/Ubuntu `apt-get install bubblewrap`, Fedora/RHEL "
                 "`dnf install bubblewrap`, Arch `pacman -S bubblewrap`, Alpine `apk add bubblewrap`; conda "
                 "`conda install -c conda-forge bubblewrap`")
