#!/usr/bin/env bash
# The GPU task's one entrypoint: vLLM's OpenAI server and our worker, side by side.
#
#   - starts the engine (`vllm serve`, bound to 127.0.0.1) and the worker (`python3 -m gpu_worker`);
#   - if either exits on its own, stops the other and exits non-zero: ECS replaces the task;
#   - on SIGTERM/SIGINT (ECS scale-in, Spot interruption) the worker drains first while the
#     engine keeps serving its in-flight requests; once the worker has exited the engine is
#     stopped; exit status is the worker's (0 after a clean drain).
#
# Environment (model and engine args; everything else the worker reads itself: WORKER_*, BATCHAPI_*):
#   ENGINE_MODEL              weights: Hugging Face id or path (required)
#   ENGINE_SERVED_MODEL_NAME  the API model name (default: WORKER_MODEL, else ENGINE_MODEL)
#   ENGINE_PORT               loopback port of the engine (default 8000)
#   ENGINE_MAX_NUM_SEQS       vLLM --max-num-seqs (default 256, vLLM's own default on most GPUs);
#                             an explicit --max-num-seqs in ENGINE_ARGS wins. The value is given
#                             to the worker (WORKER_ENGINE_MAX_NUM_SEQS): its default in-flight cap.
#   ENGINE_ARGS               extra `vllm serve` arguments, split on whitespace
#                             (--enable-prompt-tokens-details is always added: cached_tokens in usage;
#                             --scheduling-policy priority unless they name a policy: the worker
#                             then orders the engine's queue, WORKER_ENGINE_PRIORITY;
#                             --disable-uvicorn-access-log unless they name the access log)
#   ENGINE_STOP_SECONDS       how long the engine may take to stop before SIGKILL (default 20)
#   ENGINE_CMD / WORKER_CMD   the two commands (default `vllm serve` / `python3 -m gpu_worker`)
#   ENGINE_USER               the user the engine runs as (default `engine`, made by the Dockerfile);
#                             empty: the entrypoint's own (only for an image without that user)
#
# The engine parses tenant input, so it runs without the worker's credentials: its environment
# has none of the variables below (the task role's credential URI, the region and endpoints, the
# worker's and the deployment's settings, the cache-salt secret among them), and it runs as its
# own user, so it cannot read the worker's environment from /proc either. The instance metadata
# service is out of reach of containers (hop limit 1, infra/constructs/worker.py).
ENGINE_WITHHELD_PREFIXES="AWS_ ECS_CONTAINER_METADATA_URI WORKER_ BATCHAPI_"
set -uo pipefail

log() { echo "entrypoint: $*" >&2; }

: "${ENGINE_MODEL:?ENGINE_MODEL must name the model weights (Hugging Face id or path)}"
ENGINE_PORT=${ENGINE_PORT:-8000}
SERVED_NAME=${ENGINE_SERVED_MODEL_NAME:-${WORKER_MODEL:-$ENGINE_MODEL}}
read -r -a ENGINE_CMD_ARR <<< "${ENGINE_CMD:-vllm serve}"
read -r -a WORKER_CMD_ARR <<< "${WORKER_CMD:-python3 -m gpu_worker}"
read -r -a EXTRA_ARGS <<< "${ENGINE_ARGS:-}"

# One value of max-num-seqs for both sides: the engine's flag and the worker's default cap.
MAX_NUM_SEQS=""
for ((i = 0; i < ${#EXTRA_ARGS[@]}; i++)); do
  case ${EXTRA_ARGS[i]} in
    --max-num-seqs=*) MAX_NUM_SEQS=${EXTRA_ARGS[i]#*=} ;;
    --max-num-seqs) MAX_NUM_SEQS=${EXTRA_ARGS[i + 1]:-} ;;
  esac
done
if [[ -z $MAX_NUM_SEQS ]]; then
  MAX_NUM_SEQS=${ENGINE_MAX_NUM_SEQS:-256}
  EXTRA_ARGS+=(--max-num-seqs "$MAX_NUM_SEQS")
fi
# Usage with cached_tokens (prompt_tokens_details / input_tokens_details): vLLM reports them only
# with this flag. Prefix caching itself is vLLM's default for every model that supports it.
if [[ " ${EXTRA_ARGS[*]} " != *" --enable-prompt-tokens-details "* ]]; then
  EXTRA_ARGS+=(--enable-prompt-tokens-details)
fi
# The engine's waiting queue in the worker's fair order (docs/worker.md, "Order of lines in the
# engine"): priority scheduling unless ENGINE_ARGS names another policy.
if [[ " ${EXTRA_ARGS[*]} " != *" --scheduling-policy"* ]]; then
  EXTRA_ARGS+=(--scheduling-policy priority)
fi
# No access-log line a request (uvicorn's default): thousands of lines a second on a GPU, CPU
# beside the engine and log volume for nothing the worker's own per-chunk log does not say
# (docs/benchmarks.md, "What an H100 needs beside it"). ENGINE_ARGS may keep it
# (--no-disable-uvicorn-access-log).
if [[ " ${EXTRA_ARGS[*]} " != *"-uvicorn-access-log "* ]]; then
  EXTRA_ARGS+=(--disable-uvicorn-access-log)
fi
POLICY=""
for ((i = 0; i < ${#EXTRA_ARGS[@]}; i++)); do
  case ${EXTRA_ARGS[i]} in
    --scheduling-policy=*) POLICY=${EXTRA_ARGS[i]#*=} ;;
    --scheduling-policy) POLICY=${EXTRA_ARGS[i + 1]:-} ;;
  esac
done
export WORKER_ENGINE_PRIORITY=$([[ $POLICY == priority ]] && echo true || echo false)
export WORKER_ENGINE_MAX_NUM_SEQS=$MAX_NUM_SEQS
export WORKER_ENGINE_URL=http://127.0.0.1:$ENGINE_PORT
export WORKER_MODEL=${WORKER_MODEL:-$SERVED_NAME}

# The engine's environment: this one without ENGINE_WITHHELD_PREFIXES.
WITHHELD=()
for name in $(compgen -e); do
  for prefix in $ENGINE_WITHHELD_PREFIXES; do
    [[ $name == "$prefix"* ]] && WITHHELD+=(-u "$name")
  done
done
AS_ENGINE=()
ENGINE_USER=${ENGINE_USER-engine}
if [[ -n $ENGINE_USER ]]; then
  if [[ -n ${HF_HOME:-} ]]; then mkdir -p "$HF_HOME" && chown "$ENGINE_USER" "$HF_HOME"; fi
  AS_ENGINE=(setpriv --reuid="$(id -u "$ENGINE_USER")" --regid="$(id -g "$ENGINE_USER")" --init-groups --)
fi
env "${WITHHELD[@]}" "${AS_ENGINE[@]}" "${ENGINE_CMD_ARR[@]}" "$ENGINE_MODEL" --served-model-name "$SERVED_NAME" \
  --host 127.0.0.1 --port "$ENGINE_PORT" "${EXTRA_ARGS[@]}" &
engine_pid=$!
"${WORKER_CMD_ARR[@]}" &
worker_pid=$!
log "engine pid $engine_pid (port $ENGINE_PORT, max-num-seqs $MAX_NUM_SEQS), worker pid $worker_pid"

stopping=0
on_signal() {
  if (( ! stopping )); then
    stopping=1
    log "$1: draining the worker (the engine keeps serving until it exits)"
    kill -TERM "$worker_pid" 2>/dev/null
  fi
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT

stop_engine() {
  kill -TERM "$engine_pid" 2>/dev/null || return 0
  local waited=0
  while kill -0 "$engine_pid" 2>/dev/null && (( waited < ${ENGINE_STOP_SECONDS:-20} * 10 )); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$engine_pid" 2>/dev/null; then
    log "engine did not stop in ${ENGINE_STOP_SECONDS:-20} s: SIGKILL"
    kill -KILL "$engine_pid" 2>/dev/null
  fi
  wait "$engine_pid" 2>/dev/null
}

# Wait until one of the two exits (a trapped signal also ends `wait -n`: loop and look again).
while kill -0 "$worker_pid" 2>/dev/null && kill -0 "$engine_pid" 2>/dev/null; do
  wait -n "$worker_pid" "$engine_pid" 2>/dev/null
done

if ! kill -0 "$engine_pid" 2>/dev/null && kill -0 "$worker_pid" 2>/dev/null; then
  wait "$engine_pid"
  engine_status=$?
  log "the engine exited ($engine_status): stopping the worker, failing the task"
  kill -TERM "$worker_pid" 2>/dev/null
  wait "$worker_pid"
  exit $(( engine_status == 0 ? 1 : engine_status ))
fi

# The worker exited (drained after a signal, or died). Reap its status even if a signal
# interrupts the wait.
while true; do
  wait "$worker_pid"
  worker_status=$?
  kill -0 "$worker_pid" 2>/dev/null || break
done
stop_engine
if (( stopping )); then
  log "worker drained (status $worker_status); engine stopped"
  exit "$worker_status"
fi
log "the worker exited unexpectedly ($worker_status): engine stopped, failing the task"
exit $(( worker_status == 0 ? 1 : worker_status ))
