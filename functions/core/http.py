"""HTTP-level API contract shared by the CDK api construct and the local front."""

from typing import Final

#: Every route lives under this path; clients use ``https://<host>[/<stage>]/v1`` as base_url.
API_PREFIX: Final = "/v1"
#: Request bodies API Gateway hands to Lambda base64-encoded (file uploads are binary).
BINARY_MEDIA_TYPES: Final = ("multipart/form-data", "application/octet-stream")
#: The header the authorizer reads (its identity source).
AUTH_HEADER: Final = "Authorization"
