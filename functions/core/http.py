"""HTTP-level API contract shared by the CDK api construct and the local front."""

from typing import Final
from urllib.parse import quote

#: Every route lives under this path; clients use ``https://<host>[/<stage>]/v1`` as base_url.
API_PREFIX: Final = "/v1"
#: Request bodies API Gateway hands to Lambda base64-encoded (file uploads are binary).
BINARY_MEDIA_TYPES: Final = ("multipart/form-data", "application/octet-stream")
#: The header the authorizer reads (its identity source).
AUTH_HEADER: Final = "Authorization"

#: RFC 5987 attr-char besides letters and digits: what ``filename*`` carries unencoded.
_ATTR_CHARS: Final = "!#$&+-.^_`|~"


def content_disposition(filename: str) -> str:
    """The ``Content-Disposition`` of a download of ``filename`` (RFC 6266), whatever the name.

    ``filename="..."`` is an ASCII fallback: printable ASCII except ``"``, ``\\`` and ``%``
    (RFC 6266 appendix D), everything else (controls, CR/LF, non-ASCII) becomes ``_``. When that
    differs from the name, ``filename*=UTF-8''...`` (RFC 5987 percent-encoding of the UTF-8 bytes)
    carries the exact name; clients that understand it prefer it. The result is always printable
    ASCII: it cannot split a header or fail to encode as Latin-1.
    """
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in filename) or "file"
    header = f'attachment; filename="{fallback}"'
    if filename and fallback != filename:
        header += "; filename*=UTF-8''" + quote(filename, safe=_ATTR_CHARS, encoding="utf-8", errors="replace")
    return header
