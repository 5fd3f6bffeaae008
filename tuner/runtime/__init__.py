"""The start-up runtime: what a serving engine imports while it starts.

``lookup`` answers "which all2all backend for this shape and load on this machine" (the
request checked by ``request``, the answer chosen by ``choice``) from a selection table that
``profiles`` finds (search path, file names, cluster pointers) and
loads; ``table`` is the table model (parse, validate, tie rule), ``estimate`` interpolates
the measured curves, ``fingerprint`` names the machine, ``point`` is the shape and point
types with their bounds, ``measurement`` the measurement type and the figures' one declaration
(the store and select share it), ``engines`` holds each engine's literals, ``workload`` reads a
tokens-per-step histogram, ``files`` reads a file under a size cap, ``text`` makes one
safe line of an error or a name, and ``vllm_plugin`` applies the answer inside vLLM.

Every module here imports only the Python standard library (tested over the whole
package): an engine's start-up never pays for torch, and a missing or broken table is a
documented fallback with one warning, never an exception. It is also the foundation the
other packages stand on: ``a2a_tune.kernels`` and ``a2a_tune.db`` may import this package
and nothing else of ``a2a_tune.tuner`` (docs/architecture.md, "Layering";
tests/test_layout.py checks every import).
"""
