"""Models API logic: the models this deployment serves (from its settings)."""

from typing import Any
from urllib.parse import unquote

from functions.core.errors import not_found
from functions.core.settings import Settings
from functions.core.wire import Model

OWNER = "batch-api"

#: The path of GET /v1/models/{id} before the id.
MODEL_PATH_PREFIX = "/v1/models/"


def model_id_from_path(path: str) -> str:
    """The model id of a GET /v1/models/{id} path: everything after the prefix (an id may hold
    ``/``), percent-decoded once (the SDK sends ``Qwen%2FQwen2.5-7B-Instruct``)."""
    return unquote(path.split(MODEL_PATH_PREFIX, 1)[1]) if MODEL_PATH_PREFIX in path else ""


def list_models(settings: Settings, *, created: int) -> dict[str, Any]:
    """GET /v1/models: OpenAI's list envelope (no cursor fields) of the served models."""
    data = [Model(id=name, created=created, owned_by=OWNER).model_dump() for name in sorted(settings.models)]
    return {"object": "list", "data": data}


def get_model(settings: Settings, model_id: str, *, created: int) -> Model:
    if model_id not in settings.models:
        raise not_found("Model", model_id, param="model")
    return Model(id=model_id, created=created, owned_by=OWNER)
