"""Names of the CDK app, the local deployment and batchctl, defined once.

Names the Lambdas and the worker also need (queues, DLQs, receives, visibility, the state machine,
the event source, the batches/ prefix) live in ``functions/core/names.py`` (``infra`` imports
``functions``, never the reverse) and are re-exported here, so ``names.work_queue_name`` reads the
same everywhere in ``infra``.
"""

from typing import Final

from functions.core.names import (  # noqa: F401 - re-exported for infra
    AUDIT_APPEND_TIMEOUT_SECONDS,
    AUDIT_MAX_RECEIVES,
    AUDIT_VISIBILITY_SECONDS,
    BATCHES_PREFIX,
    EVENT_SOURCE,
    INGEST_MAX_RECEIVES,
    WORK_MAX_RECEIVES,
    WORK_VISIBILITY_SECONDS,
    audit_dead_letter_queue_name,
    audit_queue_name,
    dead_letter_queue_name,
    event_bus_name,
    ingest_queue_name,
    model_slug,
    state_machine_name,
    work_queue_name,
)

#: The CloudFormation stack `cdk deploy` creates (override with BATCHAPI_STACK for batchctl).
STACK_NAME: Final = "BatchApi"
#: Stack outputs batchctl reads to reach a deployed system.
OUTPUT_API_URL: Final = "ApiUrl"
OUTPUT_TABLE: Final = "TableName"
OUTPUT_BUCKET: Final = "BucketName"
#: With governance on: the audit queue (batchctl sends the operator's intents there), the Object
#: Lock bucket of the chains' copies and checkpoints, and the KMS key that signs the checkpoints
#: (``batchctl audit verify`` reads its public key). docs/audit.md.
OUTPUT_AUDIT_QUEUE: Final = "AuditQueueUrl"
OUTPUT_AUDIT_BUCKET: Final = "AuditBucketName"
OUTPUT_AUDIT_KEY: Final = "AuditSigningKeyArn"
#: API Gateway stage; the base URL clients use is ``<api>/<stage>/v1``.
API_STAGE: Final = "prod"

# --- Local deployment (make up) ----------------------------------------------------------------
LOCAL_PREFIX: Final = "batch-api-local"
LOCAL_TABLE: Final = "batch-api-local"
LOCAL_BUCKET: Final = "batch-api-local"
LOCAL_TENANT: Final = "local"
LOCAL_KEY: Final = "sk-local"
LOCAL_API_PORT: Final = 8080  # PORT overrides
LOCAL_MOTO_PORT: Final = 4566  # MOTO_PORT overrides
#: The models the local deployment serves (real small models on the CPU engine).
LOCAL_CHAT_MODEL: Final = "smollm2-135m-instruct"
LOCAL_EMBED_MODEL: Final = "all-minilm-l6-v2"
#: Speech (Whisper tiny.en, English only; docs/engine.md "Speech"): BATCHAPI_LOCAL_SPEECH=0 leaves it out.
LOCAL_SPEECH_MODEL: Final = "whisper-tiny-en"
#: Besides OpenAI's 24h, short windows so that expiry can be tried locally.
LOCAL_COMPLETION_WINDOWS: Final = ("24h", "1h", "10m", "1m", "30s", "15s")
#: Where a running `make up` writes how to reach it (batchctl reads it): <repo>/.local-state/
LOCAL_STATE_DIR: Final = ".local-state"
LOCAL_STATE_FILE: Final = "endpoint.json"
#: The local deployment's audit signing key, in its state directory (the stand-in for the KMS
#: key: outside moto, so moto access alone cannot sign a checkpoint), and its public half.
LOCAL_AUDIT_KEY_FILE: Final = "audit-signing-key.pem"
LOCAL_AUDIT_PUBLIC_KEY_FILE: Final = "audit-signing-key.pub.pem"


def _local_models() -> dict:
    from functions.core.limits import AUDIO_ENDPOINTS
    from functions.core.settings import ModelRoute

    return {
        # docs/engine.md "Endpoints": vLLM serves the Responses API for a generate model, and score
        # and rerank (cosine similarity of the embeddings) for an embeddings model.
        LOCAL_CHAT_MODEL: ModelRoute(endpoints=("/v1/chat/completions", "/v1/completions", "/v1/responses")),
        LOCAL_EMBED_MODEL: ModelRoute(endpoints=("/v1/embeddings", "/v1/score", "/v1/rerank")),
        LOCAL_SPEECH_MODEL: ModelRoute(endpoints=AUDIO_ENDPOINTS),
    }


LOCAL_MODELS: Final = _local_models()
