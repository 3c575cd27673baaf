"""A stdin/stdout task's program, run in the program's process as `python solution.py < input` would run it: in a
fresh child per input (the module's globals start anew each time), stdin a file holding the input, stdout a
pipe read here up to the sandbox's output budget, stderr the sandbox's own (counted, not compared).
"""

import builtins
import io
import os
import signal
import sys
import types

SCRIPT_NAME = "solution.py"
_REAL_INPUT = builtins.input  # imported before the program's process replaces input() with the judge's


def run_script(code, stdin: str, cap: int) -> list:
    """Run the program as a script on `stdin` in a fresh child: [stdout (at most `cap` bytes, decoded), exit
    status, signal or 0, whether stdout was cut]."""
    stdin_fd = os.open("/work" if os.path.isdir("/work") else ".", os.O_TMPFILE | os.O_RDWR, 0o600)
    data = stdin.encode("utf-8", "surrogateescape")
    while data:
        data = data[os.write(stdin_fd, data):]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.dup2(stdin_fd, 0)
            os.dup2(write_fd, 1)
            for fd in (stdin_fd, read_fd, write_fd):
                os.close(fd)
            status = _script_child(code)
        finally:
            os._exit(status)
    os.close(write_fd)
    os.close(stdin_fd)
    chunks, size, cut = [], 0, False
    while True:
        try:
            chunk = os.read(read_fd, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        if size + len(chunk) > cap:
            chunks.append(chunk[: cap - size])
            cut = True
            os.kill(pid, signal.SIGKILL)
            break
        chunks.append(chunk)
        size += len(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    signaled = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return [b"".join(chunks).decode("utf-8", "replace"), code, signaled, cut]


def _script_child(code) -> int:
    """In the child: the program as `python solution.py < input`; its exit status."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", write_through=True)
    builtins.input = _REAL_INPUT
    sys.argv = [SCRIPT_NAME]
    main = types.ModuleType("__main__")
    main.__file__ = SCRIPT_NAME
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(code, main.__dict__)
    except SystemExit as exit_:
        status = exit_.code if type(exit_.code) is int else 0 if exit_.code is None else 1
        if exit_.code is not None and type(exit_.code) is not int:
            print(exit_.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:
        status = status or 120
    return status
