"""What the tests change around the program, carried over to the program's process before its next request.

In one process, `mock.patch("random.randint")`, `monkeypatch.setattr(time, "sleep", ...)`, `monkeypatch.setenv`,
`patch.dict(os.environ, ...)` and `monkeypatch.chdir` change what the program sees. Here the tests run in the
judge, so each of those is recorded as it happens (the mock and monkeypatch entry points are wrapped) and sent
to the program before its next request: the same standard module's attribute set to a stand-in for the judge's
object (a mock's calls are then recorded in the judge, where the test asserts them), or put back when undone;
the environment; the working directory. Names of the program's own module are set directly (`ProgramModule`).
Not carried over: a test that assigns a module's attribute itself (`random.randint = ...`) rather than
through mock or monkeypatch.
"""

import functools
import os
import sys

from . import wire

_SKIPPED_SYS = frozenset({"stdin", "stdout", "stderr", "modules", "path", "meta_path", "path_hooks",
                          "path_importer_cache", "last_type", "last_value", "last_traceback"})


class Patches:
    def __init__(self):
        self.touched: set[tuple[str, str]] = set()  # (module, name) patched at some point
        self.sent: dict[tuple[str, str], object] = {}  # what the program holds now, where it differs
        self.originals: dict[tuple[str, str], object] = {}
        self.environ, self.cwd = dict(os.environ), os.getcwd()
        self.dirty = False

    def note(self, target=None, name=None, original=None):
        """A patch or its undoing: `target.name` (a module's, where it is a standard one) was `original` before
        the first patch."""
        if isinstance(target, type(sys)) and type(name) is str and target is sys.modules.get(target.__name__):
            top = target.__name__.split(".")[0]
            if top in sys.stdlib_module_names and not (target is sys and name in _SKIPPED_SYS):
                key = (target.__name__, name)
                self.touched.add(key)
                self.originals.setdefault(key, original)
        self.dirty = True

    def sync(self, judge):
        """Send what changed since the last sync (called before each request to the program)."""
        if not self.dirty:
            return
        self.dirty = False
        patches = []
        for key in sorted(self.touched):
            module = sys.modules.get(key[0])
            value = module.__dict__.get(key[1], _MISSING) if module is not None else _MISSING
            if value is self.sent.get(key, self.originals.get(key)):
                continue
            if value is self.originals.get(key):
                patches.append([key[0], key[1], None])
                self.sent.pop(key, None)
            elif value is _MISSING:  # deleted (monkeypatch.delattr)
                patches.append([key[0], key[1], "-"])
                self.sent[key] = value
            else:
                try:
                    patches.append([key[0], key[1], judge.codec.encode(value, wire.Memo())])
                except wire.Uncrossable as err:
                    judge.uncrossable.append(f"{key[0]}.{key[1]}: {err}")
                    continue
                self.sent[key] = value
        environ = dict(os.environ)
        env = None
        if environ != self.environ:
            env = {"set": {k: v for k, v in environ.items() if self.environ.get(k) != v},
                   "unset": [k for k in self.environ if k not in environ]}
            self.environ = environ
        cwd = os.getcwd()
        if patches or env or cwd != self.cwd:
            self.cwd = cwd
            reply = judge.peer.request({"op": "sync", "patches": patches, "env": env, "cwd": cwd})
            judge.result(reply, wire.Memo())


_MISSING = object()


def install(patches: Patches):
    """Wrap mock's and monkeypatch's entry points so that each change is noted (once per judge process)."""
    from unittest import mock

    def after_patch(self, *args, **kwargs):
        original = getattr(self, "temp_original", _MISSING)
        patches.note(self.getter(), self.attribute, _MISSING if original is mock.DEFAULT else original)

    _wrap(mock._patch, "__enter__", after_patch)
    _wrap(mock._patch, "__exit__", after_patch)
    _wrap(mock._patch_dict, "_patch_dict", lambda self, *a, **k: patches.note())
    _wrap(mock._patch_dict, "_unpatch_dict", lambda self, *a, **k: patches.note())
    monkeypatch = sys.modules.get("_pytest.monkeypatch")
    if monkeypatch is None:
        return

    def after_setattr(self, *args, **kwargs):
        if self._setattr:
            target, name, old = self._setattr[-1]
            patches.note(target, name, _MISSING if old is getattr(monkeypatch, "NOTSET", None) else old)

    for method in ("setattr", "delattr"):
        _wrap(monkeypatch.MonkeyPatch, method, after_setattr)
    for method in ("setenv", "delenv", "setitem", "delitem", "chdir", "undo"):
        _wrap(monkeypatch.MonkeyPatch, method, lambda self, *a, **k: patches.note())


def _wrap(cls, name: str, after):
    original = getattr(cls, name)
    if getattr(original, "_rlvr_wrapped", False):
        return

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                after(self, *args, **kwargs)
            except Exception:
                pass

    wrapper._rlvr_wrapped = True
    setattr(cls, name, wrapper)
