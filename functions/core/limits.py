"""OpenAI's documented limits and the defaults of this deployment, defined once.

The CDK stack, the local deployment, the handlers and the tests all import these.
"""

import re
from typing import Final

# --- Files (OpenAI: POST /v1/files, GET /v1/files) ---------------------------------------------
#: Purposes a client may upload with (openai.types.FilePurpose).
UPLOAD_PURPOSES: Final = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
#: Purposes a stored file may carry (openai.types.FileObject.purpose): the above plus outputs.
FILE_PURPOSES: Final = (*UPLOAD_PURPOSES, "assistants_output", "batch_output", "fine-tune-results")
#: Files API list: limit 1..10,000, default 10,000.
FILES_LIST_MAX_LIMIT: Final = 10_000
FILES_LIST_DEFAULT_LIMIT: Final = 10_000
#: expires_after.seconds bounds (1 hour .. 30 days).
EXPIRES_AFTER_MIN_SECONDS: Final = 3_600
EXPIRES_AFTER_MAX_SECONDS: Final = 2_592_000
#: purpose=batch files expire after 30 days unless told otherwise; other purposes never.
BATCH_FILE_DEFAULT_EXPIRY_SECONDS: Final = 2_592_000
#: A batch input file may be at most 200 MB (OpenAI); configurable per deployment.
DEFAULT_MAX_BATCH_FILE_BYTES: Final = 200 * 1024 * 1024
#: Any other file: 512 MB (OpenAI's per-file limit).
DEFAULT_MAX_FILE_BYTES: Final = 512 * 1024 * 1024

# --- Uploads (OpenAI: /v1/uploads) -------------------------------------------------------------
#: An Upload accepts parts for one hour, and may total at most 8 GB.
UPLOAD_EXPIRY_SECONDS: Final = 3_600
UPLOAD_MAX_BYTES: Final = 8 * 1024 * 1024 * 1024
#: S3 multipart: every part but the last must be at least 5 MiB; at most 10,000 parts.
S3_MIN_PART_BYTES: Final = 5 * 1024 * 1024
S3_MAX_PARTS: Final = 10_000
#: A batch's result parts are read in order with this many next GETs already sent (their round
#: trips overlap the reading; memory is what their sockets hold, not their bodies).
S3_READ_AHEAD: Final = 4

# --- Transport (AWS) ---------------------------------------------------------------------------
#: Lambda's synchronous invocation payload limit (request and response, after base64).
LAMBDA_PAYLOAD_LIMIT: Final = 6 * 1024 * 1024
#: API Gateway's REST payload quota (not adjustable): a larger request is its REQUEST_TOO_LARGE (413).
API_GATEWAY_PAYLOAD_LIMIT: Final = 10 * 1024 * 1024
#: File content up to this many bytes is answered inline (base64 in the Lambda response must stay
#: under LAMBDA_PAYLOAD_LIMIT); larger content is a redirect to a presigned S3 URL.
DEFAULT_INLINE_CONTENT_LIMIT: Final = 4 * 1024 * 1024
#: How long a presigned download URL is valid.
DEFAULT_PRESIGN_SECONDS: Final = 300
#: The largest Uploads part the API accepts: what a Lambda request can carry after base64 and the
#: multipart envelope. Clients must use part_size <= this (the SDK's default is 64 MB).
MAX_UPLOAD_PART_BYTES: Final = 4 * 1024 * 1024
#: The largest part the streamed route takes (functions/stream_front): OpenAI's 64 MB, the
#: SDK's default ``part_size`` for ``upload_file_chunked``.
MAX_STREAMED_PART_BYTES: Final = 64 * 1024 * 1024
#: Streamed uploads one streaming-front process takes at once, and one tenant's share of them
#: (each holds about 40 MiB at most: two 8 MiB S3 parts and the buffers; docs/benchmarks.md): a
#: tenant that opens many slow uploads holds only its own share.
STREAM_MAX_UPLOADS: Final = 16
STREAM_MAX_UPLOADS_PER_TENANT: Final = 4
#: ``complete`` assembles an Upload of at most this many bytes itself (reading and writing at most
#: this much in one request, about a second on AWS, and answering an md5 mismatch with a 400);
#: a larger one is handed to the upload assembler (docs/uploads.md), so no API request moves more.
UPLOAD_INLINE_ASSEMBLY_BYTES: Final = 32 * 1024 * 1024
#: The assembler's run time bound (Lambda's maximum): 8 GB streamed at >= 10 MB/s fits in it.
ASSEMBLER_TIMEOUT_SECONDS: Final = 900
#: Deliveries of one assembly message before it is dead-lettered (the last one marks the File error).
ASSEMBLER_MAX_RECEIVES: Final = 3

# --- Batches (OpenAI: POST /v1/batches) ---------------------------------------------------------
#: Every endpoint a batch can target: OpenAI's four that vLLM serves, vLLM's score and rerank, and
#: the two audio endpoints (a line's audio by ``body.file_url``, as vLLM's run-batch: docs/api.md,
#: "Audio lines"). Which ones a deployment serves is per model (``ModelRoute.endpoints``).
TRANSCRIPTIONS: Final = "/v1/audio/transcriptions"
TRANSLATIONS: Final = "/v1/audio/translations"
AUDIO_ENDPOINTS: Final = (TRANSCRIPTIONS, TRANSLATIONS)
DEFAULT_ENDPOINTS: Final = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/score",
    "/v1/rerank",
    *AUDIO_ENDPOINTS,
)
DEFAULT_COMPLETION_WINDOWS: Final = ("24h",)
#: A batch holds at most 50,000 requests.
DEFAULT_MAX_BATCH_LINES: Final = 50_000
#: One request line may be at most this large (a chunk is always at least one whole line).
DEFAULT_MAX_LINE_BYTES: Final = 1024 * 1024
#: A work message (chunk) covers at most this many lines and bytes of the input.
DEFAULT_CHUNK_MAX_LINES: Final = 100
DEFAULT_CHUNK_MAX_BYTES: Final = 4 * 1024 * 1024
#: A small batch is spread over up to this many chunks (so several GPUs share it), each of at
#: least MIN_CHUNK_LINES lines: chunk lines = min(chunk_max_lines, max(MIN_CHUNK_LINES,
#: ceil(total / TARGET_CHUNKS))). MIN_CHUNK_LINES is the worker's checkpoint_lines default: a smaller
#: chunk would only add per-chunk requests. See docs/lifecycle.md, "Live progress".
TARGET_CHUNKS: Final = 8
MIN_CHUNK_LINES: Final = 25
#: A large batch (more than TARGET_CHUNKS full chunks) is cut into about CHUNKS_PER_ENGINE chunks
#: for each GPU task its model may run (``ModelRoute.max_engines``), at least TARGET_CHUNKS and at
#: most LARGE_BATCH_CHUNKS (more only to give every task of a bigger fleet one: CHUNKS_PER_GPU),
#: each of at least chunk_max_lines and at most MAX_CHUNK_LINES lines (docs/lifecycle.md, "Chunking
#: rule"). A chunk costs about a dozen AWS requests whatever its lines, so fewer, bigger chunks cost
#: fewer per line; eight a task spread the batch's end over its fleet. MAX_CHUNK_LINES is within a
#: worker's in-flight cap on the smallest engines (2 x 128 sequences), so one chunk never holds more
#: lines than a worker may have waiting (docs/governance.md, "Fair share", for the bound that gives).
CHUNKS_PER_ENGINE: Final = 8
LARGE_BATCH_CHUNKS: Final = 200
MAX_CHUNK_LINES: Final = 250
#: A batch served by a fleet of more GPUs than that is cut into at least this many chunks per GPU of
#: it (down to MIN_CHUNK_LINES lines a chunk), so that every GPU can hold a chunk of one batch.
CHUNKS_PER_GPU: Final = 1
#: A batch's chunks are counted on shards of about this many chunks each, at most
#: MAX_COUNT_SHARDS (docs/lifecycle.md, "Counting shards"): a batch of up to COUNT_SHARD_CHUNKS
#: chunks counts on its own item, a larger one spreads its per-chunk writes over that many
#: partitions, so that no DynamoDB partition limits how many GPUs work on one batch.
COUNT_SHARD_CHUNKS: Final = 32
MAX_COUNT_SHARDS: Final = 64


def count_shards(chunk_count: int) -> int:
    """How many shards a batch of ``chunk_count`` chunks counts on (1: on its own item)."""
    return max(1, min(MAX_COUNT_SHARDS, -(-chunk_count // COUNT_SHARD_CHUNKS)))


def shard_of(chunk: int, shards: int) -> int:
    """The counting shard of chunk ``chunk`` of a batch counted on ``shards`` shards: consecutive
    chunks, which run at the same time, fall on different shards."""
    return chunk % shards


#: Poison budget of one chunk (docs/reliability.md, "Poison isolation"): after this many real
#: failures in a row without progress, or this many in all, its unwritten lines fail with
#: ``chunk_failed`` and it is counted. Benign releases (shutdown, an engine already down, store
#: errors) never count. The work queue's maxReceiveCount (``names.WORK_MAX_RECEIVES``) is far above.
CHUNK_MAX_STRIKES: Final = 3
CHUNK_MAX_FAILURES: Final = 10
DEFAULT_DRAIN_GRACE_SECONDS: Final = 120
DEFAULT_DRAIN_POLL_SECONDS: Final = 5
#: How long the workflow waits for a signal before it looks at the batch itself: a lost completion
#: or cancel signal is acted on within this (plus one task's time). See docs/lifecycle.md, "Lost
#: signals".
DEFAULT_RECONCILE_SECONDS: Final = 300
# --- Liveness (docs/lifecycle.md, "Liveness: every batch ends") -------------------------------
#: How often the sweeper (functions/sweeper) looks at every open batch.
DEFAULT_SWEEP_SECONDS: Final = 300
#: A batch still ``validating`` this long after its creation is failed by the sweeper
#: (``ingest_failed``). Ingest normally takes seconds to minutes; on AWS its event is retried for up
#: to INGEST_MAX_RECEIVES (5) receives x 60 min visibility + one 10 min run before it is
#: dead-lettered (and the ingest-DLQ consumer fails the batch): this deadline lies past that, so it
#: only acts when the event itself was lost (a lost S3 notification, a failing DLQ consumer).
DEFAULT_VALIDATING_TIMEOUT_SECONDS: Final = 5 * 3600 + 15 * 60
#: A batch ``in_progress``/``cancelling`` whose fan-out or workflow start has not succeeded
#: (``enqueued`` false) this long after it moved is fanned out and started again by the sweeper.
DEFAULT_ENQUEUE_GRACE_SECONDS: Final = 300
#: An open batch this long past its ``expires_at`` is finalized ``expired`` by the sweeper itself
#: (the workflow's own finalize), whatever happened to its workflow. The workflow itself acts at
#: ``expires_at`` and drains for at most DEFAULT_DRAIN_GRACE_SECONDS: the grace lies past that.
DEFAULT_EXPIRY_GRACE_SECONDS: Final = 900
#: metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
METADATA_MAX_PAIRS: Final = 16
METADATA_MAX_KEY: Final = 64
METADATA_MAX_VALUE: Final = 512
#: Batches list: limit 1..100, default 20.
BATCHES_LIST_MAX_LIMIT: Final = 100
BATCHES_LIST_DEFAULT_LIMIT: Final = 20
#: Output/error files expire 30 days after creation unless output_expires_after says otherwise.
OUTPUT_FILE_DEFAULT_EXPIRY_SECONDS: Final = 2_592_000
#: At most this many validation errors are reported in a failed batch's errors.data.
MAX_REPORTED_ERRORS: Final = 100

_WINDOW = re.compile(r"([1-9][0-9]*)([smh])")
_UNIT = {"s": 1, "m": 60, "h": 3600}


def window_seconds(window: str) -> int:
    """Seconds in a completion window such as "24h" (also "90m", "30s" for local testing)."""
    match = _WINDOW.fullmatch(window)
    if not match:
        raise ValueError(f"not a completion window: {window!r}")
    return int(match.group(1)) * _UNIT[match.group(2)]


# --- Hostile content (this deployment's own bounds; OpenAI documents none of them) -------------
#: A request's custom_id may be at most this many characters (OpenAI documents no limit).
MAX_CUSTOM_ID_CHARS: Final = 512
#: The work one line may ask by default (functions/core/work.py ``Bounds``): OpenAI's own maxima
#: for ``n`` (128) and for an embeddings input list (2048 items), the latter for every list of
#: inputs (completions prompts, rerank documents, score pairs).
MAX_LINE_N: Final = 128
MAX_LINE_INPUTS: Final = 2048
#: What the budget charges per sequence for an engine answer the worker could not read (its usage
#: unknown) of a line with no output limit: vLLM's default context of the small models it serves
#: is 2048-4096 tokens; a deployment with larger contexts sets a line bound (``Bounds``) instead.
UNKNOWN_OUTPUT_TOKENS_PER_SEQUENCE: Final = 4096
#: A request line's JSON may nest at most this deep (the line's object is level 1). Deeper lines
#: are invalid_json_line: Python's parser and pydantic's serializer have recursion limits.
MAX_JSON_DEPTH: Final = 128
#: A client's value echoed in an error message is cut to this many characters (ending in "…").
MAX_ECHOED_VALUE_CHARS: Final = 100
#: No error message is longer than this many characters: 100 errors of at most 500 characters
#: (at most 4 UTF-8 bytes each) stay well under DynamoDB's 400 KB item and EventBridge's 256 KB event.
MAX_ERROR_MESSAGE_CHARS: Final = 500
#: The worker reads at most this many bytes of one engine answer; a larger one becomes the line's
#: error ``response_too_large`` (not retried). 8 MiB is far above a real answer (a 32k-token chat
#: answer is about 150 KB; 100 embeddings of 4,096 floats about 8 MB as JSON is the edge) and
#: bounds the worker's memory: a chunk holds at most DEFAULT_CHUNK_MAX_LINES answers.
MAX_ENGINE_RESPONSE_BYTES: Final = 8 * 1024 * 1024
#: The most audio one audio line's ``file_url`` may bring (decoded ``data:`` or fetched
#: ``http(s)``): vLLM's ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`` default, 25 MiB. A ``data:`` URL is also
#: bounded by the line itself (DEFAULT_MAX_LINE_BYTES, 1 MiB: about 750 KiB of audio in base64).
MAX_AUDIO_BYTES: Final = 25 * 1024 * 1024
#: How long one audio fetch may take in all (connect, headers and body together).
AUDIO_FETCH_SECONDS: Final = 60.0
#: A file's name may be at most this many characters (OpenAI documents no limit; 255 is what
#: common file systems store). Control characters and lone surrogates are refused: see
#: docs/api.md, "Hostile content and file names".
MAX_FILENAME_CHARS: Final = 255

# --- Prompt and output policies (functions/core/guard.py; each travels in every work message) ---
#: At most this many output deny patterns per tenant, each at most this many characters.
MAX_OUTPUT_DENY_PATTERNS: Final = 32
MAX_OUTPUT_DENY_PATTERN_CHARS: Final = 512
#: At most this many pluggable output checks per tenant.
MAX_OUTPUT_CHECKS: Final = 8
#: Each per-line check (the prompt's secret scan and redaction; deny patterns and output checks on
#: a result) runs in a separate process (gpu_worker/policy_checks.py) and may take this long: a
#: check still running then is killed with its process and the line becomes an error line
#: ``policy_check_timeout`` (never sent to the engine, or its result never written). The honest
#: scan costs about 0.1 s of CPU per MiB (docs/benchmarks.md, "Policy checks"), so a line at the
#: largest input below runs well inside it on a loaded core.
POLICY_CHECK_SECONDS: Final = 10.0
#: A check's input (the request body, or the result body, as the JSON handed to the check
#: process) may be at most this large; a larger one is an error line
#: ``policy_check_input_too_large`` without being checked. It is the largest answer the worker
#: reads (MAX_ENGINE_RESPONSE_BYTES), far above the default line (DEFAULT_MAX_LINE_BYTES).
POLICY_CHECK_MAX_INPUT_BYTES: Final = 8 * 1024 * 1024

# --- Tenant policy (functions/core/tenants.py) --------------------------------------------------
#: Seconds the API caches a tenant's policy for its per-request checks (``Settings.policy_cache_seconds``).
DEFAULT_POLICY_CACHE_SECONDS: Final = 5.0


def signal_wait_seconds(expires_at: int, now: int, reconcile_seconds: int) -> int:
    """How long the workflow waits for a signal from ``now``: until the batch expires, but never
    longer than the reconcile period; at least 1 s (Step Functions' smallest timeout)."""
    return max(1, min(expires_at - now, reconcile_seconds))
