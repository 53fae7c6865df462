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
            first_id=items[0].id if items else None,  # type: ignore[attr-defined]
            last_id=items[-1].id if items else None,  # type: ignore[attr-defined]
            has_more=has_more,
        )


class ErrorDetail(WireModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(WireModel):
    error: ErrorDetail
