#!/usr/bin/env python3
"""What a second NCCL next to torch's does, one line per fact (run on a GPU machine):

    python scripts/nccl_two_libraries.py STAGED/nvidia/nccl/lib/libnccl.so.2 STAGED_SITE

A: torch with the staged (newer) libnccl.so.2 preloaded: what is mapped, what it says it is
   (ncclGetVersion; torch.cuda.nccl.version() is the version torch was built with), an all_reduce.
B: torch's own NCCL loaded first (the staged site not yet on sys.path), then the staged one opened
   by path: are both mapped, what each says it is, what nccl.ep's import and an EP group do.
Each case runs in a child process (a crash is reported as its exit status).
"""

from __future__ import annotations

import os
import subprocess
import sys

INIT = """
import ctypes, os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29517"))
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.ones(4, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
def maps(): return sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl.so" in l})
def version(lib):
    v = ctypes.c_int(); lib.ncclGetVersion(ctypes.byref(v)); return v.value
print("torch built with NCCL", torch.cuda.nccl.version(), "| all_reduce at world 1:", "ok" if t.sum().item() == 4 else "WRONG")
print("mapped:", maps(), "| ncclGetVersion:", [version(ctypes.CDLL(m, mode=os.RTLD_NOLOAD)) for m in maps()])
"""

CASE_B = (
    INIT
    + """
staged = ctypes.CDLL(os.environ["STAGED_LIB"], mode=ctypes.RTLD_LOCAL)
print("after opening the staged one by path:", maps(), "| its ncclGetVersion:", version(staged))
import sys; sys.path.insert(0, os.environ["STAGED_SITE"])
try:
    import nccl.ep as ep, nccl.ep.interop.torch as it
    print("nccl.ep imported; libnccl_ep at", ep.get_lib_path(), "| mapped:", maps())
    comm = it.get_nccl_comm_from_group(None)
    g = ep.Group.create(comm, ep.GroupConfig(algorithm=ep.Algorithm.LOW_LATENCY, num_experts=8, max_dispatch_tokens_per_rank=8, max_token_bytes=1024, num_topk=2))
    print("EP group created at world 1 without the preload:", g)
except BaseException as exc:
    print("nccl.ep without the preload:", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
"""
)


def run(name: str, code: str, env: dict) -> None:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    err = [ln for ln in done.stderr.splitlines() if ln.strip()][-3:]
    for ln in lines:
        print(f"{name}: {ln}")
    if done.returncode:
        print(f"{name}: exit {done.returncode}; stderr tail: {' | '.join(err)}")


def main() -> None:
    lib, site = sys.argv[1], sys.argv[2]
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    run("A (preloaded)", INIT, dict(base, LD_PRELOAD=lib, PORT="29518"))
    run("B (torch's first)", CASE_B, dict(base, STAGED_LIB=lib, STAGED_SITE=site, PORT="29519"))


if __name__ == "__main__":
    main()
