"""Old import path, kept for engines and users that import it: ``a2a_tune.tuner.lookup`` is
:mod:`a2a_tune.tuner.runtime.lookup` (the start-up runtime moved into ``tuner/runtime/``)."""

import sys

from a2a_tune.tuner.runtime import lookup as _module

sys.modules[__name__] = _module
