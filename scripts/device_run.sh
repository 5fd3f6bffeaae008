#!/usr/bin/env bash
# One call on a lent GPU machine: install, probe, GPU conformance tests, the full `a2a-tune run`,
# and the side-by-side round-trip benchmark. Everything the call returns is under $OUT
# (at most 8 files): log.txt, probe.json, nvml_record.json, a2a_tune.db, bench.json, profiles/*.json.
#   carry: .whl (sqlalchemy, alembic, mako, jsonschema + deps: not on the GPU image)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/a2a-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
step() { echo; echo "=== $* ($(date -u +%T))" | tee -a "$LOG"; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || { tail "$LOG"; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || { tail "$LOG"; exit 1; }
A2A="python3 -m a2a_tune.tuner.cli"

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; nvidia-smi nvlink -s -i 0 | head -5;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "triton", triton.__version__)'; } 2>&1 | tee -a "$LOG"

if [ -n "${PROFILE:-}" ]; then
  step "profile"
  timeout 180 python3 scripts/device_profile.py 2>&1 | tee -a "$LOG" | grep -v "^-\|^ *$" | head -150
fi

step "probe"
$A2A probe 2>&1 | tee -a "$LOG"
$A2A probe --json >"$OUT/probe.json" 2>>"$LOG"
$A2A probe --record "$OUT/nvml_record.json" >/dev/null 2>>"$LOG"

if [ "${TESTS:-1}" = 1 ]; then
  step "gpu conformance tests"
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/test_backends_gpu.py -p no:cacheprovider -x 2>&1 | tail -40 | tee -a "$LOG"
fi

if [ "${SWEEP:-1}" = 1 ]; then
  step "a2a-tune run"
  start=$(date +%s)
  timeout ${RUN_TIMEOUT:-420} $A2A run --device cuda --dtype bf16 --dtype fp8_e4m3 --db "sqlite:///$OUT/a2a_tune.db" --out "$OUT/profiles" --no-progress 2>&1 | tee -a "$LOG"
  echo "a2a-tune run wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi

step "side-by-side benchmark"
timeout ${BENCH_TIMEOUT:-240} python3 bench/roundtrip.py --json "$OUT/bench.json" 2>&1 | tee -a "$LOG"
step "done"
