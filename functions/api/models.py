"""Models API logic: the models this deployment serves (from its settings)."""

from typing import Any

from functions.core.errors import not_found
from functions.core.models import Model
from functions.core.settings import Settings

OWNER = "batch-api"


def list_models(settings: Settings, *, created: int) -> dict[str, Any]:
    """GET /v1/models: OpenAI's list envelope (no cursor fields) of the served models."""
    data = [Model(id=name, created=created, owned_by=OWNER).model_dump() for name in sorted(settings.models)]
    return {"object": "list", "data": data}


def get_model(settings: Settings, model_id: str, *, created: int) -> Model:
    if model_id not in settings.models:
        raise not_found("Model", model_id, param="model")
    return Model(id=model_id, created=created, owned_by=OWNER)
