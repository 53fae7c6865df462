"""Names shared by the CDK app, the local deployment and batchctl, defined once."""

import re
from typing import Final

#: The CloudFormation stack `cdk deploy` creates (override with BATCHAPI_STACK for batchctl).
STACK_NAME: Final = "BatchApi"
#: Stack outputs batchctl reads to reach a deployed system.
OUTPUT_API_URL: Final = "ApiUrl"
OUTPUT_TABLE: Final = "TableName"
OUTPUT_BUCKET: Final = "BucketName"
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
#: Besides OpenAI's 24h, short windows so that expiry can be tried locally.
LOCAL_COMPLETION_WINDOWS: Final = ("24h", "1h", "10m", "1m", "30s", "15s")
#: Where a running `make up` writes how to reach it (batchctl reads it): <repo>/.local-state/
LOCAL_STATE_DIR: Final = ".local-state"
LOCAL_STATE_FILE: Final = "endpoint.json"

# --- Queues and workflow (the stack and the local deployment name them alike) -------------------
#: After this many receives a work message goes to its queue's DLQ (a poison chunk).
WORK_MAX_RECEIVES: Final = 3
#: After this many receives an ingest event goes to the ingest DLQ.
INGEST_MAX_RECEIVES: Final = 5
#: Work messages stay invisible this long per receive; the worker extends it while a chunk runs.
WORK_VISIBILITY_SECONDS: Final = 120


def model_slug(model: str) -> str:
    """A model name as it may appear in resource names."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", model).strip("-")[:40]


def work_queue_name(prefix: str, model: str) -> str:
    return f"{prefix}-work-{model_slug(model)}"


def dead_letter_queue_name(queue_name: str) -> str:
    return f"{queue_name}-dlq"


def ingest_queue_name(prefix: str) -> str:
    return f"{prefix}-ingest"


def state_machine_name(prefix: str) -> str:
    return f"{prefix}-batch"


def _local_models() -> dict:
    from functions.core.settings import ModelRoute

    return {
        LOCAL_CHAT_MODEL: ModelRoute(endpoints=("/v1/chat/completions", "/v1/completions")),
        LOCAL_EMBED_MODEL: ModelRoute(endpoints=("/v1/embeddings",)),
    }


LOCAL_MODELS: Final = _local_models()
