"""The pipes between the judge and the program: JSON lines with a cap, and `Peer`, one side's requests and the
other side's requests served while it waits (a callback, `input()`), one exchange at a time. What the messages
carry is `codec`'s; `Memo` numbers the containers of one exchange.
"""

import json
import os
import select
import threading

LINE_CAP = 4 << 20  # bytes of one message; past it the sender is cut off


class Gone(BaseException):
    """The other side is gone or broke the protocol: nothing more can be asked of it. A BaseException, so that
    test code's `except Exception` cannot turn it into a pass."""


class Malformed(ValueError):
    pass


class Uncrossable(TypeError):
    """A value that cannot cross to the other process; the message names it."""


# ----------------------------------------------------------------------------------------------------
# Lines over pipes, read with a cap.


class Pipe:
    """One end of a pipe pair: `send` a JSON line, `receive` one (None at EOF or past the cap)."""

    def __init__(self, read_fd, write_fd, death_fd=None):
        self.read_fd, self.write_fd, self.death_fd, self.buffer = read_fd, write_fd, death_fd, b""
        self.broken = None  # why the last `receive` gave None other than the end of the stream

    def send(self, message) -> bool:
        try:
            data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
        except (ValueError, TypeError, RecursionError):
            return False
        try:
            while data:
                data = data[os.write(self.write_fd, data):]
            return True
        except OSError:
            return False

    def receive(self):
        while b"\n" not in self.buffer:
            if len(self.buffer) > LINE_CAP:
                self.broken = "a message past the size limit"
                return None
            if self.death_fd is not None:  # the other process gone: stop waiting for it
                ready, _, _ = select.select([self.read_fd, self.death_fd], [], [])
                if self.read_fd not in ready:
                    return None
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        if len(line) > LINE_CAP:
            self.broken = "a message past the size limit"
            return None
        try:
            return json.loads(line.decode("utf-8", "surrogatepass"))
        except Exception:  # RecursionError, MemoryError, UnicodeDecodeError, ValueError: not a message
            self.broken = "a message that is not JSON"
            return None


class Peer:
    """Requests to the other process over a Pipe; while one waits for its reply, the other side's own requests
    (made while serving it: a callback, `input()`) are served with `serve`. One exchange at a time (a lock),
    whichever thread makes it."""

    def __init__(self, pipe: Pipe, serve, on_fail=None):
        self.pipe, self.serve, self.on_fail = pipe, serve, on_fail
        self.lock = threading.RLock()
        self.gone = None

    def fail(self, why: str):
        if self.gone is None:
            self.gone = why
            if self.on_fail is not None:
                self.on_fail(why)
        raise Gone(self.gone)

    def request(self, message: dict) -> dict:
        with self.lock:
            if self.gone is not None:
                raise Gone(self.gone)
            if not self.pipe.send(message):
                self.fail("its pipe is closed")
            while True:
                reply = self.pipe.receive()
                if not isinstance(reply, dict):
                    self.fail((self.pipe.broken or "its process ended") if reply is None else "a malformed reply")
                if "op" not in reply:
                    return reply
                answer = self.serve(reply)
                if not self.pipe.send(answer):
                    self.fail("its pipe is closed")


# ----------------------------------------------------------------------------------------------------
# The codec.


class Memo:
    """The containers of one exchange by id: what `["@", id]` means, and which arguments a call changed."""

    __slots__ = ("ids", "objects", "next", "states", "root")

    def __init__(self):
        self.ids: dict[int, int] = {}  # id(obj) -> exchange id
        self.objects: dict[int, object] = {}  # exchange id -> obj (kept alive: ids stay unique)
        self.next = 1
        self.states: dict[int, object] = {}  # exchange id -> its shallow contents when received (callee)
        self.root = None  # the container `Codec.shallow` spells (itself, not a reference)

    def add(self, obj) -> int:
        if obj is self.root:
            self.root = None
            return self.ids[id(obj)]
        n = self.next
        self.next += 1
        self.ids[id(obj)] = n
        self.objects[n] = obj
        return n

    def define(self, n, obj):
        if type(n) is not int or n in self.objects or not 0 < n < 1 << 40:
            raise Malformed("container id")
        self.ids[id(obj)] = n
        self.objects[n] = obj
        self.next = max(self.next, n + 1)
