"""Deprecated name of `rlvr.update`, kept for one release: `import rlvr.grpo` gives that module itself (so
attribute access and monkeypatching behave exactly as on the new name)."""

import sys
import warnings

from rlvr import update as _module

warnings.warn("rlvr.grpo is now rlvr.update; the old name goes in the next release", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
