"""An out-of-tree backend module that prints when imported, through Python and straight to file
descriptor 1 (as a C library such as NCCL with NCCL_DEBUG=INFO does). Imported in every rank
through A2A_TUNE_BACKEND_MODULES=noisy_backends: `--json` output must stay one document."""

import os

print("noisy_backends: hello from print()")
os.write(1, b"noisy_backends: hello from fd 1\n")
