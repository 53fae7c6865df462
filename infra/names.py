"""Names shared by the CDK app, the local deployment and batchctl, defined once."""

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
LOCAL_TABLE: Final = "batch-api-local"
LOCAL_BUCKET: Final = "batch-api-local"
LOCAL_TENANT: Final = "local"
LOCAL_KEY: Final = "sk-local"
LOCAL_API_PORT: Final = 8080  # PORT overrides
LOCAL_MOTO_PORT: Final = 4566  # MOTO_PORT overrides
#: Where a running `make up` writes how to reach it (batchctl reads it): <repo>/.local-state/
LOCAL_STATE_DIR: Final = ".local-state"
LOCAL_STATE_FILE: Final = "endpoint.json"

# --- Queues and workflow (the stack and the local deployment name them alike) -------------------
import re as _re

#: After this many receives a work message goes to its queue's DLQ (a poison chunk).
WORK_MAX_RECEIVES: Final = 3
#: After this many receives an ingest event goes to the ingest DLQ.
INGEST_MAX_RECEIVES: Final = 5
#: Work messages stay invisible this long per receive; the worker extends it while a chunk runs.
WORK_VISIBILITY_SECONDS: Final = 120


def model_slug(model: str) -> str:
    """A model name as it may appear in resource names."""
    return _re.sub(r"[^A-Za-z0-9-]+", "-", model).strip("-")[:40]


def work_queue_name(prefix: str, model: str) -> str:
    return f"{prefix}-work-{model_slug(model)}"


def ingest_queue_name(prefix: str) -> str:
    return f"{prefix}-ingest"


def state_machine_name(prefix: str) -> str:
    return f"{prefix}-batch"
