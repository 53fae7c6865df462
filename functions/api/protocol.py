"""What the API accepts: the request models, with OpenAI's value rules as pydantic constraints.

Routes bind these (powertools validates them); logic takes them as they are. A violated rule is a
pydantic error whose ``type`` names the rule (``one_of``, ``between``, ``id_of``, or pydantic's
own such as ``too_long``); ``functions.api.errors.validation_to_api_error`` renders it in OpenAI's
words. Rules that depend on the deployment (served endpoints, completion windows, size limits) or
on stored state stay in the logic.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Self, TypeVar

from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    ValidationError,
)
from pydantic_core import PydanticCustomError, core_schema

from functions.core import ids, limits


# --- Rules ------------------------------------------------------------------------------------
class _Checked:
    """An ``Annotated`` constraint checked after the type's own validation (``_check`` raises a
    ``PydanticCustomError`` whose message becomes the API's error message)."""

    def _check(self, value: Any) -> Any:
        raise NotImplementedError

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))


@dataclass(frozen=True)
class OneOf(_Checked):
    """The value is one of ``values``."""

    values: tuple[str, ...]

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {**handler(schema), "enum": list(self.values)}

    def _check(self, value: str) -> str:
        if value not in self.values:
            expected = ", ".join(repr(v) for v in self.values)
            raise PydanticCustomError("one_of", "Supported values are: {expected}.", {"expected": expected})
        return value


@dataclass(frozen=True)
class Between(_Checked):
    """An integer from ``low`` to ``high``, both included."""

    low: int
    high: int

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {**handler(schema), "minimum": self.low, "maximum": self.high}

    def _check(self, value: int) -> int:
        if not self.low <= value <= self.high:
            raise PydanticCustomError(
                "between", "It must be between {low} and {high}.", {"low": self.low, "high": self.high}
            )
        return value


@dataclass(frozen=True)
class IdOf(_Checked):
    """An id of the ``kind`` of object whose ids start with ``prefix``."""

    prefix: str
    kind: str

    def _check(self, value: str) -> str:
        if not ids.is_valid(value, self.prefix):
            raise PydanticCustomError("id_of", "It must be a {kind} id.", {"kind": self.kind})
        return value


def filename_problem(name: str) -> str | None:
    """Why ``name`` cannot be a file's name (None: it can). Most names are accepted as OpenAI
    does (quotes, backslashes, slashes, spaces, any script): a download's Content-Disposition
    encodes them (``functions.core.http.content_disposition``). Refused: longer than
    MAX_FILENAME_CHARS, control characters (C0 with CR/LF/NUL, DEL, C1: they have no business in
    a name and break headers and logs), and lone surrogates (not storable as UTF-8)."""
    if len(name) > limits.MAX_FILENAME_CHARS:
        return f"It may be at most {limits.MAX_FILENAME_CHARS} characters"
    if any(c < " " or "\x7f" <= c <= "\x9f" for c in name):
        return "It must not contain control characters (such as NUL, CR or LF)"
    if any("\ud800" <= c <= "\udfff" for c in name):
        return "It must be valid Unicode text"
    return None


@dataclass(frozen=True)
class FileName(_Checked):
    """A file's name (``filename_problem`` says which are refused)."""

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {**handler(schema), "maxLength": limits.MAX_FILENAME_CHARS}

    def _check(self, value: str) -> str:
        problem = filename_problem(value)
        if problem is not None:
            raise PydanticCustomError("filename", problem)
        return value


#: Fields whose keys are the caller's own (a loc below them names a key, not a field).
MAP_FIELDS = frozenset({"metadata"})

UploadPurpose = Annotated[str, OneOf(limits.UPLOAD_PURPOSES)]
FilePurpose = Annotated[str, OneOf(limits.FILE_PURPOSES)]
Order = Annotated[str, OneOf(("asc", "desc"))]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
#: Batch metadata: at most 16 pairs, keys up to 64 characters, values up to 512 (OpenAI).
Metadata = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=limits.METADATA_MAX_KEY)],
        Annotated[str, StringConstraints(max_length=limits.METADATA_MAX_VALUE)],
    ],
    Field(max_length=limits.METADATA_MAX_PAIRS),
]


M = TypeVar("M", bound=BaseModel)


# --- Bodies -----------------------------------------------------------------------------------
class ExpiresAfter(BaseModel):
    """When a file expires: ``seconds`` (1 hour to 30 days) after its ``anchor``."""

    anchor: Annotated[str, OneOf(("created_at",))]
    seconds: Annotated[int, Between(limits.EXPIRES_AFTER_MIN_SECONDS, limits.EXPIRES_AFTER_MAX_SECONDS)]

    @classmethod
    def from_form(cls, anchor: str | None, seconds: int | None) -> Self | None:
        """From the multipart fields ``expires_after[anchor]``/``[seconds]``: None if neither is
        sent; a ``RequestValidationError`` located at ``expires_after`` if one is missing or bad."""
        if anchor is None and seconds is None:
            return None
        return validate(cls, {"anchor": anchor, "seconds": seconds}, loc=("form", "expires_after"))


class CreateUploadBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    bytes: int
    filename: Annotated[str, StringConstraints(min_length=1), FileName()]
    mime_type: NonEmpty
    purpose: UploadPurpose
    expires_after: ExpiresAfter | None = None


class CompleteUploadBody(BaseModel):
    part_ids: list[str]
    md5: str | None = None


class CreateBatchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None


# --- Query strings ----------------------------------------------------------------------------
class FileListQuery(BaseModel):
    """GET /v1/files: limit 1..10,000 (default 10,000), order (default desc), after a file id."""

    limit: Annotated[int, Between(1, limits.FILES_LIST_MAX_LIMIT)] = limits.FILES_LIST_DEFAULT_LIMIT
    order: Order = "desc"
    after: Annotated[str, IdOf(ids.FILE, "file")] | None = None
    purpose: FilePurpose | None = None

    @property
    def ascending(self) -> bool:
        return self.order == "asc"


class BatchListQuery(BaseModel):
    """GET /v1/batches: limit 1..100 (default 20), after a batch id; newest first."""

    limit: Annotated[int, Between(1, limits.BATCHES_LIST_MAX_LIMIT)] = limits.BATCHES_LIST_DEFAULT_LIMIT
    after: Annotated[str, IdOf(ids.BATCH, "batch")] | None = None


def validate(model: type[M], data: dict[str, Any], *, loc: tuple[str, ...]) -> M:
    """``model`` from ``data`` (None values count as absent); errors as the router reports them."""
    try:
        return model.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        errors = [{**e, "loc": (*loc, *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
