"""Deprecated name of `rlvr.rl`, kept for one release: `import rlvr.train` gives that module itself (so
attribute access and monkeypatching behave exactly as on the new name)."""

import sys
import warnings

from rlvr import rl as _module

warnings.warn("rlvr.train is now rlvr.rl; the old name goes in the next release", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
