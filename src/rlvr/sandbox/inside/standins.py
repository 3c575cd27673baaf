"""The tests' world as the program's process sees it: the judge's objects (`JudgeObject`), its `sys.stdout` and
`sys.stderr` (`Forward`: text the judge repeats where its own prints go), its `sys.stdin` and `input()` (the
judge's, as the test set them). Each use is a request through `server`, the program's side of the exchange
(`program.Server`), set once the program's process starts.
"""

import io
import os

server = None  # program.Server


class JudgeObject:
    """An object of the judge's, as the program sees it: every use is a request to the judge."""

    __slots__ = ("_rlvr_n", "_rlvr_flags", "_rlvr_type")

    def __init__(self, n: int, kind: str, flags: str):
        object.__setattr__(self, "_rlvr_n", n)
        object.__setattr__(self, "_rlvr_flags", flags)
        object.__setattr__(self, "_rlvr_type", kind)

    def __call__(self, *args, **kwargs):
        return server.ask_call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return server.ask(self, "getattr", name=name)

    def __setattr__(self, name, value):
        server.ask(self, "setattr", name=name, value=server.arg(value))

    def __delattr__(self, name):
        server.ask(self, "delattr", name=name)

    def __getitem__(self, key):
        return server.ask(self, "getitem", key=server.arg(key))

    def __setitem__(self, key, value):
        server.ask(self, "setitem", key=server.arg(key), value=server.arg(value))

    def __delitem__(self, key):
        server.ask(self, "delitem", key=server.arg(key))

    def __len__(self):
        return server.ask(self, "len")

    def __iter__(self):
        return server.ask(self, "iter")

    def __next__(self):
        return server.ask(self, "next")

    def __bool__(self):
        return server.ask(self, "bool")

    def __eq__(self, other):
        return other is self or ("e" in self._rlvr_flags and server.ask(self, "eq", other=server.arg(other)))

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("judge", self._rlvr_n)) if "e" not in self._rlvr_flags else server.ask(self, "hash")

    def __contains__(self, item):
        return server.ask(self, "contains", item=server.arg(item))

    def __str__(self):
        return server.ask(self, "str")

    def __repr__(self):
        return server.ask(self, "repr")

    def __reduce__(self):
        raise TypeError("an object of the tests' cannot be pickled (it lives in the judge's process)")


class Forward(io.TextIOBase):
    """sys.stdout / sys.stderr of the program: text kept for the next reply, which the judge writes to its own
    stream (pytest's capture, a redirect). Past the sandbox's output budget, and in a forked child, it goes to
    the real file descriptor, whose output the sandbox counts."""

    def __init__(self, fd: int, cap: int):
        super().__init__()
        self.fd, self.cap, self.parts, self.total = fd, cap, [], 0

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        if os.getpid() != server.pid or self.total > self.cap:
            _write_fd(self.fd, text.encode("utf-8", "replace"))
        else:
            self.parts.append(text)
        return len(text)

    def take(self) -> str:
        text = "".join(self.parts)
        self.parts.clear()
        return text

    def writable(self):
        return True

    @property
    def encoding(self):
        return "utf-8"

    @property
    def buffer(self):
        return _Bytes(self)


class _Bytes:
    def __init__(self, text: Forward):
        self.text = text

    def write(self, data):
        return self.text.write(bytes(data).decode("utf-8", "replace"))

    def flush(self):
        pass


class JudgeStdin(io.TextIOBase):
    """sys.stdin of the program: reads the judge's sys.stdin, as the test has set it (monkeypatch, StringIO)."""

    def readable(self):
        return True

    def read(self, size=-1):
        return server.ask_stdin("read", size if size is not None else -1)

    def readline(self, size=-1):
        return server.ask_stdin("readline", size if size is not None else -1)

    def readlines(self, hint=-1):
        return server.ask_stdin("readlines", hint)

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line


def input_of_the_judge(prompt=""):
    """The program's input(): the judge's input() (the test's patched one, or its sys.stdin)."""
    return server.ask_input(prompt)


def _write_fd(fd: int, data: bytes):
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
