"""What each API request moves through the Lambda: the API event's request and response bodies,
plus every byte the handler sends to and receives from S3 meanwhile (measured on the botocore wire:
request bodies sent, Content-Length of answers received). Used by the uploads tests (the bound per
request) and the uploads benchmark."""

import time
from typing import Any, NamedTuple


class Request(NamedTuple):
    name: str  # "POST /v1/uploads/.../parts"
    moved: dict[str, int]  # api_in, api_out, s3_in, s3_out
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.moved.values())


class WireBytes:
    def __init__(self) -> None:
        self.current: dict[str, int] | None = None
        self.requests: list[Request] = []
        self.outside = {"s3_in": 0, "s3_out": 0}  # S3 bytes moved outside any API request

    def _bucket(self) -> dict[str, int]:
        return self.current if self.current is not None else self.outside

    def sent(self, request: Any, **_: Any) -> None:
        """botocore's request-created event."""
        body, headers = request.body, request.headers
        if "X-Amz-Decoded-Content-Length" in headers:  # aws-chunked (flexible checksums)
            size = int(headers["X-Amz-Decoded-Content-Length"])
        elif body is None:
            size = 0
        elif isinstance(body, bytes | bytearray | str):
            size = len(body)
        elif "Content-Length" in headers:
            size = int(headers["Content-Length"])
        else:  # a file-like body (UploadPart over HTTP)
            here = body.tell()
            size = body.seek(0, 2) - here
            body.seek(here)
        self._bucket()["s3_out"] += size

    def received(self, http_response: Any, **_: Any) -> None:
        """botocore's after-call event."""
        self._bucket()["s3_in"] += int(http_response.headers.get("content-length", 0))

    def wrap(self, handler: Any) -> Any:
        """``handler`` (the api Lambda's), counting each event it handles."""

        def counted(event: dict[str, Any], context: Any) -> dict[str, Any]:
            self.current = {"api_in": len(event.get("body") or ""), "s3_in": 0, "s3_out": 0}
            started = time.perf_counter()
            try:
                answer = handler(event, context)
            finally:
                moved, self.current = self.current, None
            moved["api_out"] = len(answer.get("body") or "")
            self.requests.append(
                Request(f"{event['httpMethod']} {event['path']}", moved, time.perf_counter() - started)
            )
            return answer

        return counted
