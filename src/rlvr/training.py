"""Deprecated name of `rlvr.loop_common`, kept for one release: `import rlvr.training` gives that module itself (so
attribute access and monkeypatching behave exactly as on the new name)."""

import sys
import warnings

from rlvr import loop_common as _module

warnings.warn("rlvr.training is now rlvr.loop_common; the old name goes in the next release", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
