#!/usr/bin/env bash
# The `--dtype` the local (CPU) vLLM engines run in, printed on stdout (nothing: vLLM's `auto`,
# the model folder's own: bf16 chat, fp16 embeddings).
#
#   ENGINE_DTYPE set: that value.
#   The CPU has native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo): nothing (auto).
#   Otherwise: float32. vLLM's CPU platform takes bf16 as native on every x86 CPU, but without
#   those instructions oneDNN/torch emulate it: measured on an AVX2-only AMD EPYC of this machine
#   kind, a 1024x1024 bf16 matmul ran at 0.9 GFLOPS against 92 GFLOPS in float32, and the chat
#   engine generated 38 output tok/s in bf16 against 137 tok/s in float32 (128 concurrent lines,
#   docs/engine.md "dtype").
#
# Used by serve.sh (the local deployment and the tests) and by the benchmarks' `vllm run-batch`
# command, so both sides of a comparison run the same dtype.
set -euo pipefail
if [[ -n ${ENGINE_DTYPE:-} ]]; then
  echo "$ENGINE_DTYPE"
elif grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  echo ""
else
  echo float32
fi
