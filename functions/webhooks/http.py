"""The POST of one delivery attempt (stdlib only): no redirects followed (a 3xx counts as a
failed attempt, as a non-2xx), a bounded wait."""

import urllib.error
import urllib.request
from typing import Any


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
    """The HTTP status of the answer; raises when there is none (refused, timeout, TLS)."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - checked by url_problem
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
