"""The workflow Lambda's input: one typed task per state of the state machine (infra/workflow.py),
told apart by ``action``."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from functions.core.lifecycle import Signal


class _Task(BaseModel):
    model_config = ConfigDict(frozen=True)

    tenant: str
    batch_id: str


class Register(_Task):
    """WaitForSignal: store the token the execution now waits on."""

    action: Literal["register"]
    token: str


class Check(_Task):
    """Check: the wait for a signal timed out; read the batch and say what to act on (a signal may
    have been lost), or wait again."""

    action: Literal["check"]
    reconcile_seconds: int = Field(gt=0)


class Drain(_Task):
    """Drain: wait for running chunks of a cancelled or expired batch."""

    action: Literal["drain"]
    signal: Signal


class Finalize(_Task):
    """Finalize: assemble the files and set the terminal state."""

    action: Literal["finalize"]
    signal: Signal


class TaskError(BaseModel):
    """The error a state's Catch recorded (``{"Error", "Cause"}``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    Error: str | None = None
    Cause: str | None = None

    def describe(self) -> str:
        return str(self.Cause or self.Error or "unknown error")


class Fail(_Task):
    """Fail: the last resort after an unrecoverable error."""

    action: Literal["fail"]
    error: TaskError = TaskError()

    @field_validator("error", mode="before")
    @classmethod
    def _none_is_unknown(cls, value: Any) -> Any:
        return TaskError() if value is None else value


Task = Annotated[Register | Check | Drain | Finalize | Fail, Field(discriminator="action")]
TASK: TypeAdapter[Task] = TypeAdapter(Task)


def parse(event: dict[str, Any]) -> Register | Check | Drain | Finalize | Fail:
    """The task an event asks for; pydantic's ValidationError for an unknown action or a missing field."""
    return TASK.validate_python(event)
