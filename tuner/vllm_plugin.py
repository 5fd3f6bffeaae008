"""Old import path, kept for engines and users that import it: ``a2a_tune.tuner.vllm_plugin`` is
:mod:`a2a_tune.tuner.runtime.vllm_plugin` (the start-up runtime moved into ``tuner/runtime/``)."""

import sys

from a2a_tune.tuner.runtime import vllm_plugin as _module

sys.modules[__name__] = _module
