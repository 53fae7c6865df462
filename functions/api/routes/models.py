"""/v1/models

A model id may hold ``/`` (Hugging Face ids: ``Qwen/Qwen2.5-7B-Instruct``). The openai SDK sends
``client.models.retrieve("Qwen/Qwen2.5-7B-Instruct")`` as ``/v1/models/Qwen%2FQwen2.5-7B-Instruct``
(its ``path_template`` percent-encodes the slash), and API Gateway may hand the Lambda that path
with the ``%2F`` kept or decoded to ``/``. So the id is read from the whole rest of the path, over
one segment or several, and percent-decoded once (``models.model_id_from_path``).
"""

import time
from typing import Any

from aws_lambda_powertools.event_handler.api_gateway import Router

from functions.core import deps
from functions.core.wire import Model

from .. import models
from . import tenant

router = Router()

#: When this process started: the `created` of the served models (they are served from deployment).
CREATED = int(time.time())


@router.get("/v1/models")
def list_models() -> dict[str, Any]:
    tenant(router)
    return models.list_models(deps.settings(), created=CREATED)


@router.get("/v1/models/<model_id>")
def get_model(model_id: str) -> Model:
    tenant(router)
    return models.get_model(deps.settings(), models.model_id_from_path(router.current_event.path), created=CREATED)


# An id with a literal slash (a decoded %2F, or a client that does not encode it): more segments.
@router.get("/v1/models/<model_id>/.+")
def get_model_with_slash(model_id: str) -> Model:
    tenant(router)
    return models.get_model(deps.settings(), models.model_id_from_path(router.current_event.path), created=CREATED)
