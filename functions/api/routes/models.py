"""/v1/models"""

import time
from typing import Any

from aws_lambda_powertools.event_handler.api_gateway import Router

from functions.core import deps
from functions.core.models import Model

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
    return models.get_model(deps.settings(), model_id, created=CREATED)
