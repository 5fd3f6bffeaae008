"""`nvlink_one_sided`: our Triton kernels over torch symmetric memory (CUDA backend).

Mechanism (kernels in `_one_sided_kernels.py`): every rank maps every peer's workspace;
dispatch writes each token once into the receive slot of every rank owning one of its
experts (its metadata to all ranks), and the last CTA raises a flag on each peer. The
receiver waits on flags, never on a count-exchange collective. Combine writes each
received row's partial sum back into its source's combine slot; the source sums the rows
of the ranks it sent to. No host synchronisation anywhere, so a round trip can be captured
in a CUDA graph (the sweep times it under graph replay at decode sizes).

Received rows: a W x capacity layout (slot = the token's index on its source rank), or
W x step after `set_step_tokens(step)` (an engine's max tokens per rank this step: FlashInfer's
`runtime_max_tokens_per_rank`), so a workspace sized for the largest batch costs a small
step only its own slots;
rows beyond a source's token count, and rows of tokens with no expert here, carry topk ids
of -1. `Dispatched.x` is a view of the workspace: valid until the next dispatch.

Workspace per rank: 2 * W * capacity * H payload elements + W * capacity * 2k int32 of
metadata (capacity = max_tokens_per_rank): 0.94 GB for W=2, 16384 tokens, H=7168, bf16.
Needs: CUDA, Triton, peer access between every pair of GPUs of the group on one node
(NVLink: `probe` shows the island), torch symmetric memory.
"""

from __future__ import annotations

from . import _one_sided_kernels
from ._symmetric_backend import SymmetricMemoryBackend
from .registry import register_backend


@register_backend
class NvlinkOneSided(SymmetricMemoryBackend):
    name = "nvlink_one_sided"
    closest_names = {"vllm": "flashinfer_nvlink_one_sided"}  # the same semantics, not FlashInfer's code
    kernels = _one_sided_kernels
    step_sized = True  # slots are source * step + index: the step's size sets every grid
