#!/usr/bin/env bash
# MAINTAINER TOOL for a one-GPU machine (not a user step): NCCL EP and DeepEP V2 staged
# (scripts/stage_nccl_ep.py --pack, carried as .ncclep.tar.xz), the facts of two NCCLs in one
# process, DeepEP V2 built, and both libraries at one rank (scripts/peers_one_rank.py): runs,
# refuses or crashes, the invariant, their planted bugs, the round trip at T = 1 and 128.
# SANITIZE=1: also NCCL EP HT under compute-sanitizer's memcheck.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/a2a-out}; mkdir -p "$OUT"; LOG=$OUT/log.txt
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-200} ))
step() { echo; echo "=== $* ($(date -u +%T), $(( DEADLINE - $(date +%s) )) s left)" | tee -a "$LOG"; }
left() { local l=$(( DEADLINE - $(date +%s) - 5 )); echo $(( l > 1 ? l : 1 )); }  # a step's timeout: what the budget leaves (>= 1 s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || exit 1
mkdir -p .ncclep && tar -C .ncclep -xJf .ncclep.tar.xz || exit 1
SITE=$PWD/.ncclep/site LIB=$PWD/.ncclep/site/nvidia/nccl/lib/libnccl.so.2
export PYTHONPATH=/tmp/site
step "machine"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat .ncclep/STAGED | head -12;
  python3 -c 'import torch; print("torch", torch.__version__, "nccl (its own)", torch.cuda.nccl.version())'; } 2>&1 | tee -a "$LOG"
step "two NCCLs: torch with the staged one preloaded; both mapped in one process; nccl.ep without the preload"
timeout 60 python3 scripts/nccl_two_libraries.py "$LIB" "$SITE" 2>&1 | tee -a "$LOG"
step "DeepEP V2: building deep_ep._C in the background"
( PYTHONPATH=/tmp/site timeout 300 python3 scripts/stage_nccl_ep.py --out .ncclep --build-deepep --jobs 12 >/tmp/deepep-v2-build.txt 2>&1; echo "build exit $?" >>/tmp/deepep-v2-build.txt ) &
BUILD=$!
export LD_PRELOAD=$LIB NCCL_HOME=$SITE/nvidia/nccl PYTHONPATH=$SITE:/tmp/site:$PWD/tests/support NCCL_EP_JIT_CACHE_DIR=/tmp/ncclep-jit EP_JIT_CACHE_DIR=/tmp/deepep-jit
P="python3 scripts/peers_one_rank.py --limit ${LIMIT:-60}"
step "NCCL EP at one rank (LL, HT), T = 1, 128; HT also at T = 4 and 128 (it refuses T x team ranks not a multiple of 4)"
timeout $(left) $P --backend nccl_ep_low_latency --backend nccl_ep_high_throughput --json $OUT/peers_nccl_ep.json 2>&1 | tail -25 | tee -a "$LOG"
timeout $(left) $P --backend nccl_ep_high_throughput --tokens 4,128 2>&1 | tail -12 | tee -a "$LOG"
if [ "${SANITIZE:-0}" = 1 ]; then  # HT's illegal memory access at one rank (2026-12-08): where it reads or writes
  step "compute-sanitizer memcheck: NCCL EP HT at one rank (SANITIZE=1)"
  timeout $(left) compute-sanitizer --tool memcheck --target-processes all --print-limit 20 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/kernels/test_nccl_ep_gpu.py -k nccl_ep_high 2>&1 | tail -60 | tee -a "$LOG"
fi
step "NCCL EP planted bug (rows rolled): must be incorrect"
A2A_TUNE_BACKEND_MODULES=planted_libraries timeout $(left) $P --backend planted_nccl_ep_low_latency --tokens 128 2>&1 | tail -12 | tee -a "$LOG"
step "waiting for DeepEP V2's build"; ( sleep $(left); kill $BUILD 2>/dev/null ) & wait $BUILD; tail -25 /tmp/deepep-v2-build.txt | tee -a "$LOG"
export EP_NCCL_ROOT_DIR=$SITE/nvidia/nccl
step "DeepEP V2 at one rank (LL, HT), T = 1, 128"
timeout $(left) $P --backend deepep_v2_low_latency --backend deepep_v2_high_throughput --json $OUT/peers_deepep_v2.json 2>&1 | tail -25 | tee -a "$LOG"
step "DeepEP V2 planted bug: must be incorrect"
A2A_TUNE_BACKEND_MODULES=planted_libraries timeout $(left) $P --backend planted_deepep_v2_low_latency --tokens 128 2>&1 | tail -12 | tee -a "$LOG"
step "their one-rank GPU tests (tests/kernels/test_nccl_ep_gpu.py)"
timeout $(left) python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/kernels/test_nccl_ep_gpu.py 2>&1 | tail -12 | tee -a "$LOG"
step "a2a-tune backends (world 1, staged, preloaded)"
timeout 20 python3 -m a2a_tune.tuner.cli backends 2>&1 | grep -A2 "nccl_ep\|deepep_v2" | head -24 | tee -a "$LOG"
step done
