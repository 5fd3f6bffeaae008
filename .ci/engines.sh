#!/usr/bin/env bash
# The real engines for tests/test_engines_real.py: vLLM and SGLang at the versions whose
# literals tuner/runtime/engines.py holds, in an environment of their own (.venv-engines, or
# $1), with a2a-tune installed into it so vLLM loads the plugin through its entry point.
#
# vLLM runs on its CPU platform (VLLM_TARGET_DEVICE=cpu at run time). Both engines are
# installed --no-deps with the measured list .ci/engines-requirements.txt: their full
# requirements pull CUDA wheels and another torch. torch is the pinned CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-engines}
VLLM_VERSION=0.33.0
SGLANG_VERSION=0.5.23
start=$SECONDS
python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0                            # the CPU build (a plain `torch` pulls CUDA wheels)
"${pip[@]}" --no-deps --no-compile "vllm==$VLLM_VERSION" "sglang==$SGLANG_VERSION" -r .ci/engines-requirements.txt
"${pip[@]}" --no-deps -e .                           # the plugin's entry point (vllm.general_plugins)
echo "engines: vllm $VLLM_VERSION + sglang $SGLANG_VERSION in $VENV ($((SECONDS - start)) s)"
