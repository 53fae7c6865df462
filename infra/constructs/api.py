"""The public API: API Gateway REST API -> Lambda authorizer (bearer key -> tenant) -> api Lambda.

Everything clients see is OpenAI's: binary media types so multipart uploads reach the handler
intact, ``/v1/{proxy+}`` for every route (the api Lambda routes itself), and gateway responses
that answer API Gateway's own rejections with OpenAI's error envelope.
"""

import json

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from functions.core import http
from functions.core.settings import Settings
from infra import names
from infra.config import DeployConfig

from .common import (
    KEY_ITEMS,
    acknowledge,
    acknowledge_wildcards,
    arn_in_findings,
    grant_api_writes,
    grant_items,
    log_group,
)
from .lambdas import Lambdas
from .storage import Storage

#: API Gateway's own REST integration timeout: the api Lambda gets no longer.
INTEGRATION_TIMEOUT = cdk.Duration.seconds(http.INTEGRATION_TIMEOUT_SECONDS)
_JSON = "application/json"
#: Headers every gateway response carries: JSON, and API Gateway's request id as ``x-request-id``
#: (the header the SDK reads into ``_request_id``; the api Lambda sets the same id on its answers).
_GATEWAY_HEADERS = {"Content-Type": f"'{_JSON}'", http.REQUEST_ID_HEADER: "context.requestId"}


def access_log_format() -> apigw.AccessLogFormat:
    f = apigw.AccessLogField
    return apigw.AccessLogFormat.custom(
        json.dumps(
            {
                "requestId": f.context_request_id(),
                "time": f.context_request_time_epoch(),
                "ip": f.context_identity_source_ip(),
                "method": f.context_http_method(),
                "path": f.context_path(),
                "status": f.context_status(),
                "bytes": f.context_response_length(),
                "latencyMs": f.context_response_latency(),
                "tenant": f.context_authorizer_principal_id(),
                "authorizerStatus": f.context_authorizer_status(),
                "integrationStatus": f.context_integration_status(),
                "error": f.context_error_message(),
                "xrayTraceId": f.context_xray_trace_id(),
            }
        )
    )


class Api(Construct):
    """``rest_api``, ``api_function`` (reads the table, writes its own partitions; reads and writes
    the bucket), ``authorizer_function`` (reads API key items only), ``url`` (the ``base_url``
    clients use, ending in ``/v1``)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage: Storage,
        lambdas: Lambdas,
        settings: Settings,
    ) -> None:
        super().__init__(scope, id)
        self.settings = settings
        env = settings.to_env()

        self.api_function = lambdas.function(
            self,
            "ApiFunction",
            handler="functions.api.handler.handler",
            environment=env,
            description="OpenAI-compatible Files/Uploads/Batches API",
            memory_size=1024,  # multipart parsing of parts up to MAX_UPLOAD_PART_BYTES
            timeout=INTEGRATION_TIMEOUT,
        )
        # Reads anywhere but writes only its own partitions (``common.grant_api_writes``): never an
        # API key or a tenant policy, which are the operator's (batchctl, admin credentials).
        storage.table.grant_read_data(self.api_function)
        grant_api_writes(self.api_function, storage)
        storage.bucket.grant_read_write(self.api_function)
        bucket, table = arn_in_findings(storage.bucket), arn_in_findings(storage.table)
        objects = "grant_read_write's action groups, on this one bucket's objects only"
        acknowledge_wildcards(
            self.api_function.role,
            {
                f"Resource::{bucket}/*": "Objects are keyed per tenant and file/upload id (files/<tenant>/<id>, "
                "uploads/...); the api Lambda serves every tenant, so it needs the bucket's objects.",
                "Action::s3:GetObject*": objects + " (reads, ranged reads, multipart copy sources).",
                "Action::s3:GetBucket*": objects + " (bucket metadata the SDK reads).",
                "Action::s3:List*": objects + " (listing an upload's parts, multipart parts).",
                "Action::s3:DeleteObject*": objects + " (DELETE /v1/files, cancelled uploads).",
                "Action::s3:Abort*": objects + " (aborting a failed multipart assembly).",
                f"Resource::{table}/index/*": "Queries on the table's GSIs (listing a tenant's files by purpose).",
            },
        )

        self.authorizer_function = lambdas.function(
            self,
            "AuthorizerFunction",
            handler="functions.authorizer.handler.handler",
            environment=env,
            description="Bearer API key -> tenant (REQUEST authorizer)",
            memory_size=256,
            timeout=cdk.Duration.seconds(10),
        )
        # A key lookup is one GetItem of the key's item (``KEY#<sha256>``): no other item (not a
        # key's listing, its id or a tenant policy: the disabled state is on the key item), no
        # index, no writes.
        grant_items(self.authorizer_function, storage, ("dynamodb:GetItem",), (KEY_ITEMS,))

        self.rest_api = self._rest_api(config)
        authorizer = apigw.RequestAuthorizer(
            self,
            "Authorizer",
            handler=self.authorizer_function,
            identity_sources=[apigw.IdentitySource.header(http.AUTH_HEADER)],
            results_cache_ttl=cdk.Duration.seconds(config.authorizer_cache_seconds),
        )
        v1 = self.rest_api.root.add_resource(http.API_PREFIX.strip("/"))
        proxy = v1.add_proxy(
            default_integration=apigw.LambdaIntegration(self.api_function, proxy=True, timeout=INTEGRATION_TIMEOUT),
            default_method_options=apigw.MethodOptions(
                authorizer=authorizer, authorization_type=apigw.AuthorizationType.CUSTOM
            ),
            any_method=True,
        )
        self._gateway_responses()
        self.url = self._endpoint(config)

        # Each acknowledgment sits on the resource its rule checks (RestApi, Method, Stage).
        acknowledge(
            self.rest_api.node.default_child,
            "AwsSolutions-APIG2",
            "Requests are validated by the api Lambda (powertools + pydantic), which answers with OpenAI's "
            "error envelope; API Gateway request validators would answer in another shape.",
        )
        acknowledge(
            proxy,
            "AwsSolutions-COG4",
            "Clients authenticate with OpenAI-style bearer API keys (stored hashed in DynamoDB), checked by the "
            "REQUEST Lambda authorizer on every method; Cognito user pools do not fit the OpenAI SDK.",
        )
        if config.web_acl_arn is None:
            acknowledge(
                self.rest_api.deployment_stage,
                "AwsSolutions-APIG3",
                "A WAFv2 web ACL is a per-deployment choice (config web_acl_arn); without one the stage is "
                "protected by bearer-key auth and stage throttling.",
            )

    def _rest_api(self, config: DeployConfig) -> apigw.RestApi:
        access_logs = log_group(self, "AccessLogs", config)
        api = apigw.RestApi(
            self,
            "RestApi",
            description="OpenAI-compatible Files and Batch API",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            binary_media_types=list(http.BINARY_MEDIA_TYPES),
            # The account-level role API Gateway needs to write execution logs (one per region).
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=cdk.RemovalPolicy.RETAIN,
            deploy_options=apigw.StageOptions(
                stage_name=names.API_STAGE,
                throttling_rate_limit=config.throttle.rate_limit,
                throttling_burst_limit=config.throttle.burst_limit,
                tracing_enabled=True,
                metrics_enabled=True,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,  # never log request bodies (customer data)
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=access_log_format(),
            ),
        )
        # The stack names its outputs (infra/names.py); drop RestApi's automatic stage-URL output,
        # which lacks the /v1 prefix clients need.
        api.node.try_remove_child("Endpoint")
        cloud_watch_role = api.node.find_child("CloudWatchRole")
        acknowledge(
            cloud_watch_role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]",
            "The documented AWS-managed policy for API Gateway's account-level logging role (execution logs).",
        )
        if config.web_acl_arn is not None:
            wafv2.CfnWebACLAssociation(
                self, "WebAcl", resource_arn=api.deployment_stage.stage_arn, web_acl_arn=config.web_acl_arn
            )
        return api

    def _gateway_responses(self) -> None:
        """API Gateway's own answers (``http.GATEWAY_ERRORS``, which the local front renders too), in
        OpenAI's error envelope with ``x-request-id``; 429s with ``Retry-After``."""
        for error in http.GATEWAY_ERRORS.values():
            headers = dict(_GATEWAY_HEADERS)
            if error.retry_after_seconds is not None:
                headers["Retry-After"] = f"'{error.retry_after_seconds}'"
            self.rest_api.add_gateway_response(
                "".join(part.capitalize() for part in error.response_type.split("_")),
                type=apigw.ResponseType.of(error.response_type),
                status_code=str(error.status) if error.status is not None else None,
                templates={_JSON: error.template()},
                response_headers=headers,
            )

    def _endpoint(self, config: DeployConfig) -> str:
        # With the streaming front on, the custom domain is the distribution's (its origin is this
        # API's own execute-api URL): ``DeployConfig.api_domain``.
        if (api_domain := config.api_domain) is None:
            return self.rest_api.url_for_path(http.API_PREFIX)
        domain = self.rest_api.add_domain_name(
            "Domain",
            domain_name=api_domain.name,
            certificate=acm.Certificate.from_certificate_arn(self, "Certificate", api_domain.certificate_arn),
            endpoint_type=apigw.EndpointType.REGIONAL,
            security_policy=apigw.SecurityPolicy.TLS_1_2,
        )
        return f"https://{domain.domain_name}{http.API_PREFIX}"

    @property
    def functions(self) -> dict[str, lambda_.Function]:
        return {"api": self.api_function, "authorizer": self.authorizer_function}
