"""Wire models: named and shaped exactly like OpenAI's API objects (see ``openai.types``)."""

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

FilePurpose = Literal[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
    "evals",
]


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileObject(WireModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileDeleted(WireModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class Upload(WireModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None = None


class UploadPart(WireModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str


T = TypeVar("T", bound=WireModel)


class ListPage(WireModel, Generic[T]):
    """OpenAI's cursor list envelope."""

    object: Literal["list"] = "list"
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, items: list[T], has_more: bool) -> "ListPage[T]":
        return cls(
            data=items,
            first_id=items[0].id if items else None,  # type: ignore[attr-defined]  # every listed model has an id
            last_id=items[-1].id if items else None,  # type: ignore[attr-defined]  # (not expressible in T's bound)
            has_more=has_more,
        )


class ErrorDetail(WireModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(WireModel):
    error: ErrorDetail


# --- Batches ------------------------------------------------------------------------------------
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
TERMINAL_STATUSES: tuple[str, ...] = ("failed", "completed", "expired", "cancelled")


class BatchError(WireModel):
    code: str | None = None
    line: int | None = None
    message: str | None = None
    param: str | None = None


class BatchErrors(WireModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(WireModel):
    completed: int = 0
    failed: int = 0
    total: int = 0


class InputTokensDetails(WireModel):
    cached_tokens: int = 0


class OutputTokensDetails(WireModel):
    reasoning_tokens: int = 0


class BatchUsage(WireModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int = 0


class Batch(WireModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts | None = None
    usage: BatchUsage | None = None
    metadata: dict[str, str] | None = None


class Model(WireModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


# --- Batch lines (input, output) -------------------------------------------------------------
class BatchLineResponse(WireModel):
    status_code: int
    request_id: str
    body: dict


class BatchLineError(WireModel):
    code: str
    message: str


class BatchOutputLine(WireModel):
    """One line of a batch's output or error file."""

    id: str
    custom_id: str
    response: BatchLineResponse | None = None
    error: BatchLineError | None = None
