#!/usr/bin/env bash
# MAINTAINER TOOL for the lent GPU machine (not a user step): one call of the device tool runs
# this from the repository root and returns what it writes under $OUT. Users run `a2a-tune run`
# (and `a2a-tune check`) on their own machines instead.
#
# One call: install, probe, the conformance check and GPU tests, the full `a2a-tune run`,
# evaluate/adaptive, and the side-by-side round-trip benchmark. Everything the call returns is
# under $OUT (at most 8 files): log.txt, probe.json, nvml_record.json, a2a_tune.db, bench.json,
# profiles/*.json, evaluate.txt.
#   carry: .whl (sqlalchemy, alembic, mako, jsonschema + deps: not on the GPU image)
#          .flashinfer (optional: `python scripts/stage_flashinfer.py` output, FlashInfer's backends)
#   steps (1 = run): TESTS=1 FI_CHECK=$TESTS SWEEP=1 EVAL=0 ADAPTIVE=0 KNOBS=0 RESELECT=0 QUANT_BENCH=0 RESUME=0 BENCH=1
#   RUN_ARGS: extra `a2a-tune run` options (e.g. --capacity 8192, --backend B).
#   EVAL_MOST=N: evaluate at N held-out midpoints of the table (default 8); EVAL_TOKENS overrides.
#   CAPACITY=N: also sweep DeepSeek-V3 bf16 with fixed-capacity backends built for N tokens/rank
#   (CAP_TOKENS: the counts), to compare with the same counts at capacity = load.
#   EXTRA_SWEEP="options": one more `a2a-tune sweep` with these options into the same store.
#   DB_IN=path: start from a copy of that store (an earlier call's, carried); TABLE_IN=path: the
#   table EVAL/KNOBS use when this call's run wrote none (copied to $OUT/profiles first).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/a2a-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
step() { echo; echo "=== $* ($(date -u +%T))" | tee -a "$LOG"; }
counts() {  # measurements per run, and cases measured twice in a run (a resumed sweep must repeat nothing)
  python3 - "$1" <<'PY'
import sys
from collections import Counter
from a2a_tune.db import open_store
with open_store(sys.argv[1]) as store:
    for run in store.runs():
        keys = Counter(m.key for m in store.measurements(run.id))
        twice = sum(n > 1 for n in keys.values())
        print(f"run {run.id}: status {run.status}, {sum(keys.values())} measurements, {twice} cases measured twice")
PY
}
run_id() { grep -oE "^run [0-9]+ \(completed\)" "$1" 2>/dev/null | tail -1 | grep -oE "[0-9]+"; }  # from a sweep's output

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || { tail "$LOG"; exit 1; }
export PYTHONPATH=/tmp/site
if [ -d .flashinfer/site ]; then
  # The staged FlashInfer carries its kernels prebuilt (AOT): never compile here.
  export PYTHONPATH=$PWD/.flashinfer/site:$PYTHONPATH FLASHINFER_DISABLE_JIT=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || { tail "$LOG"; exit 1; }
A2A="python3 -m a2a_tune.tuner.cli"
DB="sqlite:///$OUT/a2a_tune.db"
[ -n "${DB_IN:-}" ] && cp "$DB_IN" "$OUT/a2a_tune.db" && chmod u+w "$OUT/a2a_tune.db"
if [ -n "${TABLE_IN:-}" ]; then mkdir -p "$OUT/profiles"; cp "$TABLE_IN" "$OUT/profiles/"; chmod u+w "$OUT"/profiles/*; fi

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; nvidia-smi nvlink -s -i 0 | head -5;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "triton", triton.__version__)';
  [ -f .flashinfer/STAGED ] && cat .flashinfer/STAGED; } 2>&1 | tee -a "$LOG"

if [ -d .flashinfer/site ]; then
  step "flashinfer: staged import + AOT modules load"
  timeout 120 python3 -c '
import time; t = time.time()
import flashinfer.comm.trtllm_moe_alltoall as one, flashinfer.comm.trtllm_alltoall as two
print("import", round(time.time() - t, 2), "s")
one.get_moe_alltoall_module("trtllm"); two.get_comm_alltoall_module(); print("AOT modules loaded", round(time.time() - t, 2), "s")
' 2>&1 | tail -5 | tee -a "$LOG"
fi

step "probe"
$A2A probe 2>&1 | tee -a "$LOG"
$A2A probe --json >"$OUT/probe.json" 2>>"$LOG"
$A2A probe --record "$OUT/nvml_record.json" >/dev/null 2>>"$LOG"

if [ "${FI_CHECK:-${TESTS:-1}}" = 1 ] && [ -d .flashinfer/site ]; then
  step "a2a-tune check: FlashInfer's backends, W=2, DeepSeek-V3 shape"
  timeout 160 $A2A check --device cuda --world 2 --preset deepseek-v3 --timeout 75 --no-progress \
    --backend flashinfer_nvlink_one_sided --backend flashinfer_nvlink_two_sided 2>&1 | tee -a "$LOG"
fi

if [ "${TESTS:-1}" = 1 ]; then
  step "gpu conformance tests"
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/test_backends_gpu.py tests/test_quant.py -p no:cacheprovider -rf --tb=line 2>&1 | tail -60 | tee -a "$LOG"
fi

if [ "${QUANT_BENCH:-0}" = 1 ]; then
  step "block-FP8 quantize: Triton kernel vs torch path (one GPU)"
  timeout 120 python3 bench/quant.py 2>&1 | tee -a "$LOG"
fi

if [ "${SWEEP:-1}" = 1 ]; then
  step "a2a-tune run"
  start=$(date +%s)
  timeout ${RUN_TIMEOUT:-420} $A2A run --device cuda --dtype bf16 --dtype fp8_e4m3 --db "$DB" --out "$OUT/profiles" --no-progress ${RUN_ARGS:-} 2>&1 | tee -a "$LOG" "$OUT/run.out"
  echo "a2a-tune run wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
  FULL_RUN=$(run_id "$OUT/run.out"); rm -f "$OUT/run.out"
fi

if [ "${EVAL:-0}" = 1 ]; then
  step "a2a-tune evaluate (held-out token counts)"
  start=$(date +%s)
  TABLE=$(ls "$OUT"/profiles/*.json | head -1)
  if [ -z "${EVAL_TOKENS:-}" ] && [ -n "${EVAL_MOST:-}" ]; then
    EVAL_TOKENS=$(python3 -c "import json, sys; from a2a_tune.tuner.evaluate import held_out_tokens as h
t = h((t for e in json.load(open(sys.argv[1]))['entries'] for t in e['tokens']), most=$EVAL_MOST); print(','.join(map(str, t)))" "$TABLE")
    echo "held-out token counts: $EVAL_TOKENS" | tee -a "$LOG"
  fi
  timeout ${EVAL_TIMEOUT:-200} $A2A evaluate --profile "$TABLE" --device cuda --db "$DB" --no-progress ${EVAL_TOKENS:+--tokens $EVAL_TOKENS} $(for b in ${EVAL_BACKENDS:-}; do echo --backend $b; done) 2>&1 | tee -a "$LOG" "$OUT/evaluate.txt" "$OUT/eval.out"
  EVAL_RUN=$(grep -oE "run [0-9]+: regret" "$OUT/eval.out" | grep -oE "[0-9]+"); rm -f "$OUT/eval.out"
  echo "evaluate wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG" "$OUT/evaluate.txt"
fi

if [ "${ADAPTIVE:-0}" = 1 ]; then
  step "a2a-tune sweep --adaptive (same plan as the run)"
  start=$(date +%s)
  timeout ${ADAPTIVE_TIMEOUT:-200} $A2A sweep --adaptive --device cuda --dtype bf16 --dtype fp8_e4m3 --db "$DB" --no-progress 2>&1 | tee -a "$LOG" "$OUT/evaluate.txt" "$OUT/adaptive.out"
  echo "adaptive sweep wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG" "$OUT/evaluate.txt"
  ADAPTIVE_RUN=$(run_id "$OUT/adaptive.out"); rm -f "$OUT/adaptive.out"
  # its table, scored on this call's full-grid run and held-out run (SCORE_RUNS: other run ids)
  if [ -n "$ADAPTIVE_RUN" ]; then
    $A2A select --db "$DB" --run "$ADAPTIVE_RUN" --out "$OUT/adaptive" 2>&1 | tail -1 | tee -a "$LOG"
    for r in ${SCORE_RUNS:-${FULL_RUN:-} ${EVAL_RUN:-}}; do
      $A2A evaluate --profile "$(ls "$OUT"/adaptive/*.json | head -1)" --db "$DB" --run "$r" 2>&1 | tee -a "$LOG" "$OUT/evaluate.txt"
    done
    rm -rf "$OUT/adaptive"
  else
    echo "the adaptive sweep did not complete: no table to score" | tee -a "$LOG"
  fi
fi

if [ -n "${CAPACITY:-}" ]; then
  step "a2a-tune sweep --capacity $CAPACITY (DeepSeek-V3 bf16; step-sized backends told each step's size)"
  start=$(date +%s)
  CT=${CAP_TOKENS:-1,8,64,128,256,320,384,1024,4096,16384}
  for cap in "" "--capacity $CAPACITY"; do
    timeout ${CAPACITY_TIMEOUT:-150} $A2A sweep --device cuda --preset deepseek-v3 --dtype bf16 --tokens $CT --no-refine \
      --db "$DB" --no-progress $cap 2>&1 | tail -3 | tee -a "$LOG"
  done
  echo "capacity sweeps wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi

if [ -n "${EXTRA_SWEEP:-}" ]; then
  step "a2a-tune sweep $EXTRA_SWEEP"
  start=$(date +%s)
  timeout ${EXTRA_TIMEOUT:-150} $A2A sweep --device cuda --db "$DB" --no-progress $EXTRA_SWEEP 2>&1 | tail -3 | tee -a "$LOG"
  echo "extra sweep wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi

if [ "${KNOBS:-0}" = 1 ]; then
  step "a2a-tune tune-knobs (Optuna) for nvlink_one_sided, DeepSeek-V3 shape"
  # the table to write the knobs into: this call's (run or TABLE_IN), else the shipped one
  [ -n "$(ls "$OUT"/profiles/*.json 2>/dev/null)" ] || { mkdir -p "$OUT/profiles"; cp profiles/h200.nvl18x2.node1.json "$OUT/profiles/"; chmod u+w "$OUT"/profiles/*; }
  start=$(date +%s)
  timeout ${KNOBS_TIMEOUT:-200} $A2A tune-knobs --backend nvlink_one_sided --preset deepseek-v3 --tokens ${KNOB_TOKENS:-1,128,8192} \
    --trials ${KNOB_TRIALS:-8} --device cuda --db "$DB" --profile "$(ls "$OUT"/profiles/*.json | head -1)" --no-progress 2>&1 | tee -a "$LOG" "$OUT/evaluate.txt"
  echo "tune-knobs wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG" "$OUT/evaluate.txt"
fi

if [ "${RESELECT:-0}" = 1 ]; then
  step "select again from the store: the knobs tune-knobs stored must stay in the table"
  $A2A select --db "$DB" --run ${RESELECT_RUN:-${FULL_RUN:-1}} --out "$OUT/reselect" 2>&1 | tail -3 | tee -a "$LOG"
  python3 - "$OUT"/profiles/*.json "$OUT"/reselect/*.json <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
def knobs(path):
    return {(e["hidden"], e["dtype"], b): v["knobs"] for e in json.load(open(path))["entries"]
            for b, v in e["backends"].items() if v.get("knobs")}
tuned, again = knobs(sys.argv[1]), knobs(sys.argv[2])
print("knobs in the tuned table:", len(tuned), "| in the table selected again:", len(again), "| equal:", tuned == again)
PY
  rm -rf "$OUT/reselect"
fi

if [ "${RESUME:-0}" = 1 ]; then
  step "kill -9 a sweep mid-way, then --resume it"
  RDB="sqlite:///$OUT/resume.db"
  RARGS="--device cuda --preset deepseek-v3 --dtype bf16 --db $RDB --no-progress"
  timeout -s KILL ${KILL_AFTER:-30} $A2A sweep $RARGS >>"$LOG" 2>&1; echo "first sweep: exit $? (137 = killed)" | tee -a "$LOG"
  counts "$RDB" 2>&1 | tee -a "$LOG"
  timeout 200 $A2A sweep --resume $RARGS 2>&1 | tail -4 | tee -a "$LOG"
  counts "$RDB" 2>&1 | tee -a "$LOG"
fi

if [ "${BENCH:-1}" = 1 ]; then
  step "side-by-side benchmark"
  timeout ${BENCH_TIMEOUT:-240} python3 bench/roundtrip.py --json "$OUT/bench.json" 2>&1 | tee -a "$LOG"
fi
step "done"
