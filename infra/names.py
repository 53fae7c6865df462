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
