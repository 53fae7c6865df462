"""The api Lambda: API Gateway (REST proxy) -> one router per resource -> the logic.

Routes read the tenant the authorizer put in the request context, bind the request to the models
of ``protocol`` and return the wire models of ``functions.core.models``; ``errors`` renders every
failure as OpenAI's error envelope.
"""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from . import errors
from .routes import batches, files, models, uploads

logger = Logger(service="batch-api")
app = APIGatewayRestResolver(enable_validation=True)
for resource in (files, uploads, batches, models):
    app.include_router(resource.router)
errors.register(app, logger)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return app.resolve(event, context)
