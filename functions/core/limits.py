"""OpenAI's documented limits and the defaults of this deployment, defined once.

The CDK stack, the local deployment, the handlers and the tests all import these.
"""

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

# --- Transport (AWS) ---------------------------------------------------------------------------
#: Lambda's synchronous invocation payload limit (request and response, after base64).
LAMBDA_PAYLOAD_LIMIT: Final = 6 * 1024 * 1024
#: File content up to this many bytes is answered inline (base64 in the Lambda response must stay
#: under LAMBDA_PAYLOAD_LIMIT); larger content is a redirect to a presigned S3 URL.
DEFAULT_INLINE_CONTENT_LIMIT: Final = 4 * 1024 * 1024
#: How long a presigned download URL is valid.
DEFAULT_PRESIGN_SECONDS: Final = 300
#: The largest Uploads part the API accepts: what a Lambda request can carry after base64 and the
#: multipart envelope. Clients must use part_size <= this (the SDK's default is 64 MB).
MAX_UPLOAD_PART_BYTES: Final = 4 * 1024 * 1024
