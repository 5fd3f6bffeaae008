#!/usr/bin/env bash
# MAINTAINER TOOL for the lent GPU machine (not a user step): one call of the device tool runs
# this from the repository root and returns what it writes under $OUT. Users run `a2a-tune run`
# (and `a2a-tune check`) on their own machines instead.
#
# Two modes (MODE=, default: by the GPUs visible):
#   x2       (2+ GPUs, `nvidia-h200-x2`, one call <= 25 min): what has not run on 2 GPUs yet --
#            the GPU tests (the refactored NVLink kernels, DeepEP's and torch NVSHMEM's invariants),
#            `a2a-tune run` re-measuring the table with DeepEP and NVSHMEM timed beside the others,
#            `evaluate` on it, and the side-by-side `bench/roundtrip.py`.
#   virtual  (1 GPU, `nvidia-h200`, ~5 min): every GPU test one GPU runs (`pytest -m gpu tests`: virtual
#            ranks at W = 2..8, the quantizers, tests/tuner/test_figures_gpu.py's timing and memory figures
#            checked against planted durations and bytes; tests needing 2 GPUs skip), `a2a-tune check
#            --virtual` at W = 2, 3, 4, 8 and its planted bugs, what a 1-GPU host says to `a2a-tune run`,
#            the quantizers' GB/s against the copy bandwidth at H = 4096 and 7168 (bench/quant.py, quant.json)
#            and their share of a dispatch (bench/quant_share.py; QUANT_BENCH=0 leaves both out),
#            the peers at one rank (scripts/peers_one_rank.py: FlashInfer one- and two-sided, DeepEP
#            low-latency and high-throughput: runs, refuses or crashes, round trip), the virtual ranks'
#            fixed costs at T = 1 (never a table); it ends with a table of what passed, failed, skipped
#            and why, and the figures against their bounds: each quantizer's share of the copy bandwidth
#            and the planted halves' errors, eager and graph (scripts/device_summary.py). Returns log.txt,
#            probe.json, figures.json, quant.json, peers.json, junit*.xml. DEEPEP_SRC=path (a carried DeepEP V1 source tree): stage DeepEP there in the
#            background when .deepep/site is not carried; KEEP_DEEPEP=1: return it as deepep.tar.xz (carry
#            it back as .deepep.tar.xz). ALL_TESTS=0, CHECKS=0, PEER_TESTS=0, FIXED_COSTS=0: leave those out;
#            PEERS="b1 b2": only those peers at one rank.
# Everything the call returns is under $OUT (at most 8 files): log.txt, probe.json,
# nvml_record.json, a2a_tune.db, bench.json, profiles/*.json, evaluate.txt.
#   carry: .whl (sqlalchemy, alembic, mako, jsonschema + deps: not on the GPU image)
#          .flashinfer (optional: `python scripts/stage_flashinfer.py` output, FlashInfer's backends)
#          .deepep (optional: `python scripts/stage_deepep.py` output, DeepEP's backends)
#          .ncclep.tar.xz (optional: `python scripts/stage_nccl_ep.py --pack`: NCCL EP, DeepEP V2, NCCL 2.32)
#   BUDGET_S: the whole call's seconds (default 1440 = 24 min); every step's timeout is cut to
#   what is left, and a step with under a minute left is reported "not run: out of time".
#   x2 steps (1 = run): TESTS=1 FI_CHECK=0 SWEEP=1 NCCLEP=1 EVAL=1 ADAPTIVE=0 KNOBS=0 RESELECT=0 QUANT_BENCH=0 RESUME=0 BENCH=1
#   RUN_ARGS: extra `a2a-tune run` options (e.g. --capacity 8192, --backend B).
#   EVAL_MOST=N: evaluate at N held-out midpoints of the table (default 8); EVAL_TOKENS overrides.
#   CAPACITY=N: also sweep DeepSeek-V3 bf16 with fixed-capacity backends built for N tokens/rank
#   (CAP_TOKENS: the counts), to compare with the same counts at capacity = load.
#   EXTRA_SWEEP="options": one more `a2a-tune sweep` with these options into the same store.
#   DB_IN=path: start from a copy of that store (an earlier call's, carried); TABLE_IN=path: the
#   table EVAL/KNOBS use when this call's run wrote none (copied to $OUT/profiles first).
#   VIRTUAL_WORLDS: the virtual mode's world sizes (default "2 3 4 8").
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/a2a-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-1440} ))
step() { echo; echo "=== $* ($(date -u +%T), $(( DEADLINE - $(date +%s) )) s left)" | tee -a "$LOG"; }
# tmo S: a step's timeout, S seconds or what the budget leaves (minus 30 s to write up); 0: none left
tmo() { local left=$(( DEADLINE - $(date +%s) - 30 )); (( left < 60 )) && { echo 0; return; }; (( left < $1 )) && echo "$left" || echo "$1"; }
# run_for S STEP...: run STEP under `timeout $(tmo S)`, or say it was not run
run_for() { local t; t=$(tmo "$1"); shift; if [ "$t" = 0 ]; then echo "not run: out of time ($*)" | tee -a "$LOG"; return 125; fi; timeout "$t" "$@"; }
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
[ -d .deepep/site ] && export PYTHONPATH=$PWD/.deepep/site:$PYTHONPATH  # DeepEP built for this torch and arch
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
MODE=${MODE:-$([ "$GPUS" -ge 2 ] && echo x2 || echo virtual)}
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || { tail "$LOG"; exit 1; }
A2A="python3 -m a2a_tune.tuner.cli"
DB="sqlite:///$OUT/a2a_tune.db"
[ -n "${DB_IN:-}" ] && cp "$DB_IN" "$OUT/a2a_tune.db" && chmod u+w "$OUT/a2a_tune.db"
if [ -n "${TABLE_IN:-}" ]; then mkdir -p "$OUT/profiles"; cp "$TABLE_IN" "$OUT/profiles/"; chmod u+w "$OUT"/profiles/*; fi

step "machine (mode $MODE, $GPUS GPU(s))"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; nvidia-smi nvlink -s -i 0 | head -5;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "triton", triton.__version__)';
  [ -f .flashinfer/STAGED ] && cat .flashinfer/STAGED; [ -f .deepep/STAGED ] && cat .deepep/STAGED; } 2>&1 | tee -a "$LOG"

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
[ "$MODE" = virtual ] || $A2A probe --record "$OUT/nvml_record.json" >/dev/null 2>>"$LOG"  # virtual: $OUT holds 8 files at most

if [ "$MODE" = virtual ]; then
  SUPPORT=$PWD/tests/support  # planted_kernels.py: bugs planted in copies of the kernel modules
  STEPS=/tmp/a2a-steps.tsv; : >"$STEPS"
  # record NAME RC START: one line of the closing table (rc 124/137: cut by its timeout)
  record() { local r="ok"; [ "$2" = 0 ] || r="FAIL (exit $2)"; { [ "$2" = 124 ] || [ "$2" = 137 ]; } && r="FAIL (timed out)"; [ "$2" = 125 ] && r="not run: out of time"
    printf '%s\t%s\t%s\n' "$1" "${4:-$r}" "$(( $(date +%s) - $3 ))" >>"$STEPS"; }
  mkdir -p /tmp/a2a-e96 && echo '{"num_local_experts": 96, "num_experts_per_tok": 8, "hidden_size": 7168}' >/tmp/a2a-e96/config.json
  PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --tb=short --timeout ${TEST_CASE_TIMEOUT:-240}"

  # DeepEP: carried staged (.deepep/site, or .deepep.tar.xz: an earlier call's KEEP_DEEPEP=1, a third of
  # the size to carry), or built here from a carried V1 source tree while the GPU tests run
  [ ! -d .deepep/site ] && [ -f .deepep.tar.xz ] && mkdir -p .deepep && tar -C .deepep -xJf .deepep.tar.xz
  if [ ! -d .deepep/site ] && [ -n "${DEEPEP_SRC:-}" ]; then
    step "DeepEP: staging from $DEEPEP_SRC in the background (scripts/stage_deepep.py, ${DEEPEP_JOBS:-12} jobs)"
    ( t0=$(date +%s); run_for 420 python3 scripts/stage_deepep.py --source "$DEEPEP_SRC" --arch 9.0 --jobs "${DEEPEP_JOBS:-12}" \
        --out .deepep >/tmp/a2a-deepep.txt 2>&1; record "DeepEP staged from source (background)" $? "$t0" ) &
    BUILD=$!
  fi

  step "the figures checked against planted durations and bytes (tests/tuner/test_figures_gpu.py, world 1)"
  t0=$(date +%s)
  A2A_TUNE_FIGURES_OUT=$OUT/figures.json run_for 180 $PYTEST tests/tuner/test_figures_gpu.py \
    --junitxml=/tmp/a2a-junit-figures.xml 2>&1 | tail -40 | tee -a "$LOG"; record "pytest: timing and memory figures" "${PIPESTATUS[0]}" "$t0"

  if [ "${ALL_TESTS:-1}" = 1 ]; then
    step "every other GPU test that one GPU runs: pytest -m gpu tests (virtual ranks, quantizers, ...; 2-GPU tests skip)"
    t0=$(date +%s)
    run_for ${TEST_TIMEOUT:-300} $PYTEST tests --ignore=tests/tuner/test_figures_gpu.py --junitxml=$OUT/junit.xml 2>&1 \
      | tail -60 | tee -a "$LOG"; record "pytest -m gpu tests" "${PIPESTATUS[0]}" "$t0"
  fi

  [ "${CHECKS:-1}" = 1 ] || VIRTUAL_WORLDS=" "
  for w in ${VIRTUAL_WORLDS:-2 3 4 8}; do
    step "a2a-tune check --device cuda --virtual --world $w (the shipped NVLink kernels)"
    shape="--preset deepseek-v3"; [ $(( 256 % w )) = 0 ] || shape="--model-config /tmp/a2a-e96/config.json"
    t0=$(date +%s)
    run_for ${CHECK_TIMEOUT:-90} $A2A check --device cuda --virtual --world "$w" $shape --no-progress \
      --backend nvlink_one_sided --backend nvlink_low_latency 2>&1 | tee -a "$LOG"; record "check --virtual --world $w" "${PIPESTATUS[0]}" "$t0"
  done
  if [ "${CHECKS:-1}" = 1 ]; then
    step "a2a-tune check --virtual --world 4: planted kernel bugs (each must FAIL; exit 1)"
    t0=$(date +%s)
    A2A_TUNE_BACKEND_MODULES=planted_kernels PYTHONPATH=$SUPPORT:$PYTHONPATH run_for ${CHECK_TIMEOUT:-90} $A2A check --device cuda \
      --virtual --world 4 --preset deepseek-v3 --no-progress --backend planted_kernel_drops_row --backend planted_kernel_wrong_slot \
      --backend planted_kernel_skips_flag 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
    record "check --virtual: 3 planted bugs FAIL" "$rc" "$t0" "$([ "$rc" = 1 ] && echo ok || echo "FAIL (exit $rc, 1 expected)")"
  fi

  if [ "${CHECKS:-1}" = 1 ]; then
    step "what a one-GPU host says: a2a-tune run (must refuse in one line, exit 2)"
    t0=$(date +%s)
    run_for 60 $A2A run --no-progress --db "sqlite:////tmp/a2a-refused.db" 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
    record "run on one GPU refused" "$rc" "$t0" "$([ "$rc" = 2 ] && echo ok || echo "FAIL (exit $rc, 2 expected)")"
  fi

  if [ "${QUANT_BENCH:-1}" = 1 ]; then
    step "the payload quantizers (fp8_e4m3, mxfp8, nvfp4) against the device's copy bandwidth (bench/quant.py)"
    t0=$(date +%s)
    run_for 150 python3 bench/quant.py --hidden 4096,7168 --tokens 1,128,2048,16384 --json "$OUT/quant.json" 2>&1 | tee -a "$LOG"
    record "bench/quant.py: quantizers vs copy" "${PIPESTATUS[0]}" "$t0"
    step "the quantize's share of an NVFP4 / MXFP8 dispatch, 2 virtual ranks (bench/quant_share.py)"
    t0=$(date +%s)
    run_for 90 python3 bench/quant_share.py 2>&1 | tee -a "$LOG"
    record "bench/quant_share.py: quantize in the dispatch" "${PIPESTATUS[0]}" "$t0"
  fi

  if [ -n "${BUILD:-}" ]; then
    step "waiting for DeepEP's staging"
    wait "$BUILD"; tail -3 /tmp/a2a-deepep.txt | tee -a "$LOG"
  fi
  [ -d .deepep/site ] && export PYTHONPATH=$PWD/.deepep/site:$PYTHONPATH
  step "the peers at one rank: runs, refuses or crashes, and the round trip (scripts/peers_one_rank.py)"
  { [ -f .flashinfer/STAGED ] && cat .flashinfer/STAGED; [ -f .deepep/STAGED ] && cat .deepep/STAGED; } 2>&1 | tee -a "$LOG"
  t0=$(date +%s)
  run_for ${PEERS_TIMEOUT:-240} python3 scripts/peers_one_rank.py --json "$OUT/peers.json" $(for b in ${PEERS:-}; do echo --backend "$b"; done) 2>&1 | tail -40 | tee -a "$LOG"
  record "peers at one rank (FlashInfer, DeepEP)" "${PIPESTATUS[0]}" "$t0"
  if [ "${PEER_TESTS:-1}" = 1 ]; then
    t0=$(date +%s)
    run_for 180 $PYTEST tests/kernels/test_virtual_gpu.py -k "one_rank or ep_size_1" --junitxml=/tmp/a2a-junit-peers.xml 2>&1 \
      | tail -20 | tee -a "$LOG"; record "pytest: the peers' one-rank tests" "${PIPESTATUS[0]}" "$t0"
  fi

  if [ "${FIXED_COSTS:-1}" = 1 ]; then
    step "virtual ranks' fixed costs at T = 1: one GPU's HBM stands in for the link, never a table"
    t0=$(date +%s)
    run_for 90 python3 - <<'PY' 2>&1 | tee -a "$LOG"
from a2a_tune.kernels import MoEShape, get_backend
from a2a_tune.kernels.virtual import VirtualWorld
for name in ("nvlink_one_sided", "nvlink_low_latency"):
    for w in (2, 4, 8):
        with VirtualWorld(w, "cuda").build(get_backend(name), MoEShape(256, 8, 7168, 1, "bf16"), step=1) as ranks:
            t = ranks.time_round_trips(ranks.inputs([1] * w), warmup=10, iters=50)
            us = sorted(t.us)[len(t.us) // 2]
            print(f"{name} W={w} T=1 timing={t.timing}: {us:.1f} us per round trip of all {w} ranks, {us / w:.1f} per rank")
PY
    record "virtual ranks' fixed costs at T = 1" "${PIPESTATUS[0]}" "$t0"
  fi
  [ "${KEEP_DEEPEP:-0}" = 1 ] && [ -d .deepep/site ] && tar -C .deepep -cJf "$OUT/deepep.tar.xz" . 2>>"$LOG"
  cp /tmp/a2a-junit-figures.xml /tmp/a2a-junit-peers.xml "$OUT"/ 2>/dev/null
  step "done: $(( $(date +%s) - DEADLINE + ${BUDGET_S:-1440} )) s in all"
  python3 scripts/device_summary.py --steps "$STEPS" --quant "$OUT/quant.json" --figures "$OUT/figures.json" \
    "$OUT/junit.xml" "$OUT/a2a-junit-figures.xml" "$OUT/a2a-junit-peers.xml" 2>&1 | tee -a "$LOG"
  exit 0
fi

if [ "${FI_CHECK:-0}" = 1 ] && [ -d .flashinfer/site ]; then
  step "a2a-tune check: FlashInfer's backends, W=2, DeepSeek-V3 shape"
  run_for 160 $A2A check --device cuda --world 2 --preset deepseek-v3 --timeout 75 --no-progress \
    --backend flashinfer_nvlink_one_sided --backend flashinfer_nvlink_two_sided 2>&1 | tee -a "$LOG"
fi

if [ "${TESTS:-1}" = 1 ]; then
  step "gpu conformance tests: the refactored NVLink kernels, DeepEP's and torch NVSHMEM's invariants, 2 GPUs"
  run_for ${TEST_TIMEOUT:-360} python3 -m pytest -q -m gpu tests/kernels/test_backends_gpu.py tests/kernels/test_deepep_gpu.py \
    tests/kernels/test_quant.py -p no:cacheprovider -rfs --tb=line 2>&1 | tail -80 | tee -a "$LOG"
fi

if [ "${QUANT_BENCH:-0}" = 1 ]; then
  step "block-FP8 quantize: Triton kernel vs torch path (one GPU)"
  timeout 120 python3 bench/quant.py 2>&1 | tee -a "$LOG"
fi

if [ "${SWEEP:-1}" = 1 ]; then
  step "a2a-tune run"
  start=$(date +%s)
  run_for ${RUN_TIMEOUT:-540} $A2A run --device cuda --dtype bf16 --dtype fp8_e4m3 --db "$DB" --out "$OUT/profiles" --no-progress ${RUN_ARGS:-} 2>&1 | tee -a "$LOG" "$OUT/run.out"
  echo "a2a-tune run wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
  FULL_RUN=$(run_id "$OUT/run.out"); rm -f "$OUT/run.out"
fi

if [ "${NCCLEP:-1}" = 1 ] && { [ -f .ncclep.tar.xz ] || [ -d .ncclep/site ]; }; then
  # NCCL EP and DeepEP V2 (scripts/stage_nccl_ep.py --pack): they need NCCL >= 2.30 in the process, so
  # they run with the staged NCCL preloaded (torch then runs on it too), in a sweep of their own
  # beside the two NCCL baselines re-measured on that NCCL; never timed at 2+ ranks before this.
  step "NCCL EP and DeepEP V2 at 2 ranks (staged NCCL preloaded): check, then a sweep beside the NCCL baselines"
  [ -d .ncclep/site ] || { mkdir -p .ncclep && tar -C .ncclep -xJf .ncclep.tar.xz; }
  NEP=(env LD_PRELOAD=$PWD/.ncclep/site/nvidia/nccl/lib/libnccl.so.2 PYTHONPATH=$PWD/.ncclep/site:$PYTHONPATH
       EP_NCCL_ROOT_DIR=$PWD/.ncclep/site/nvidia/nccl NCCL_EP_JIT_CACHE_DIR=/tmp/ncclep-jit EP_JIT_CACHE_DIR=/tmp/deepep-jit)
  [ -f .ncclep/site/deep_ep/__init__.py ] || [ ! -d .ncclep/deepep-src ] || \
    run_for 300 "${NEP[@]}" python3 scripts/stage_nccl_ep.py --out .ncclep --build-deepep 2>&1 | tail -5 | tee -a "$LOG"
  NEP_BACKENDS="--backend nccl_ep_low_latency --backend nccl_ep_high_throughput --backend deepep_v2_low_latency --backend deepep_v2_high_throughput"
  "${NEP[@]}" $A2A backends 2>&1 | grep -A1 "nccl_ep\|deepep_v2" | head -16 | tee -a "$LOG"
  run_for 300 "${NEP[@]}" $A2A check --device cuda --world 2 --preset deepseek-v3 --timeout 120 --no-progress $NEP_BACKENDS 2>&1 | tee -a "$LOG"
  run_for ${NCCLEP_TIMEOUT:-420} "${NEP[@]}" $A2A sweep --device cuda --preset deepseek-v3 --dtype bf16 --dtype fp8_e4m3 --db "$DB" \
    --no-progress $NEP_BACKENDS --backend allgather_reducescatter --backend nccl_all2allv 2>&1 | tail -8 | tee -a "$LOG"
fi

if [ "${EVAL:-1}" = 1 ]; then
  step "a2a-tune evaluate (held-out token counts)"
  start=$(date +%s)
  TABLE=$(ls "$OUT"/profiles/*.json | head -1)
  if [ -z "${EVAL_TOKENS:-}" ] && [ -n "${EVAL_MOST:-8}" ]; then
    EVAL_TOKENS=$(python3 -c "import json, sys; from a2a_tune.tuner.evaluate import held_out_tokens as h
t = h((t for e in json.load(open(sys.argv[1]))['entries'] for t in e['tokens']), most=${EVAL_MOST:-8}); print(','.join(map(str, t)))" "$TABLE")
    echo "held-out token counts: $EVAL_TOKENS" | tee -a "$LOG"
  fi
  run_for ${EVAL_TIMEOUT:-180} $A2A evaluate --profile "$TABLE" --device cuda --db "$DB" --no-progress ${EVAL_TOKENS:+--tokens $EVAL_TOKENS} $(for b in ${EVAL_BACKENDS:-}; do echo --backend $b; done) 2>&1 | tee -a "$LOG" "$OUT/evaluate.txt" "$OUT/eval.out"
  EVAL_RUN=$(grep -oE "run [0-9]+: regret" "$OUT/eval.out" | grep -oE "[0-9]+"); rm -f "$OUT/eval.out"
  echo "evaluate wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG" "$OUT/evaluate.txt"
fi

if [ "${ADAPTIVE:-0}" = 1 ]; then
  step "a2a-tune sweep --adaptive (same plan as the run)"
  start=$(date +%s)
  run_for ${ADAPTIVE_TIMEOUT:-200} $A2A sweep --adaptive --device cuda --dtype bf16 --dtype fp8_e4m3 --db "$DB" --no-progress 2>&1 | tee -a "$LOG" "$OUT/evaluate.txt" "$OUT/adaptive.out"
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
    run_for ${CAPACITY_TIMEOUT:-150} $A2A sweep --device cuda --preset deepseek-v3 --dtype bf16 --tokens $CT --no-refine \
      --db "$DB" --no-progress $cap 2>&1 | tail -3 | tee -a "$LOG"
  done
  echo "capacity sweeps wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi

if [ -n "${EXTRA_SWEEP:-}" ]; then
  step "a2a-tune sweep $EXTRA_SWEEP"
  start=$(date +%s)
  run_for ${EXTRA_TIMEOUT:-150} $A2A sweep --device cuda --db "$DB" --no-progress $EXTRA_SWEEP 2>&1 | tail -3 | tee -a "$LOG"
  echo "extra sweep wall time: $(( $(date +%s) - start )) s" | tee -a "$LOG"
fi

if [ "${KNOBS:-0}" = 1 ]; then
  step "a2a-tune tune-knobs (Optuna) for nvlink_one_sided, DeepSeek-V3 shape"
  # the table to write the knobs into: this call's (run or TABLE_IN), else the shipped one
  [ -n "$(ls "$OUT"/profiles/*.json 2>/dev/null)" ] || { mkdir -p "$OUT/profiles"; cp profiles/h200.nvl18x2.node1.json "$OUT/profiles/"; chmod u+w "$OUT"/profiles/*; }
  start=$(date +%s)
  run_for ${KNOBS_TIMEOUT:-200} $A2A tune-knobs --backend nvlink_one_sided --preset deepseek-v3 --tokens ${KNOB_TOKENS:-1,128,8192} \
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
  run_for 200 $A2A sweep --resume $RARGS 2>&1 | tail -4 | tee -a "$LOG"
  counts "$RDB" 2>&1 | tee -a "$LOG"
fi

if [ "${BENCH:-1}" = 1 ]; then
  step "side-by-side benchmark"
  run_for ${BENCH_TIMEOUT:-240} python3 bench/roundtrip.py --json "$OUT/bench.json" 2>&1 | tee -a "$LOG"
fi
step "done"
