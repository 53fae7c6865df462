"""A Lambda context object for handlers called in-process by the local deployment."""

import time
import uuid
from dataclasses import dataclass, field

#: Lambda's longest timeout: what a context without its function's own timeout reports.
MAX_TIMEOUT_SECONDS = 900


@dataclass
class LocalLambdaContext:
    function_name: str
    memory_limit_in_mb: int = 1024
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: The function's timeout (the api Lambda's is API Gateway's 29 s integration timeout).
    timeout_seconds: float = MAX_TIMEOUT_SECONDS
    started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.started + self.timeout_seconds - time.monotonic()) * 1000))
