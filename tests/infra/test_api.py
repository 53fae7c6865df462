"""REST API: binary media types, the authorizer, gateway responses in OpenAI's envelope, the stage."""

import json

from functions.core import http
from functions.core.errors import UNAUTHORIZED_BODY
from infra import names


def test_binary_media_types_come_from_the_http_contract(synth):
    _, api = synth.one("AWS::ApiGateway::RestApi")
    assert api["Properties"]["BinaryMediaTypes"] == list(http.BINARY_MEDIA_TYPES)
    assert "multipart/form-data" in api["Properties"]["BinaryMediaTypes"]
    assert api["Properties"]["EndpointConfiguration"] == {"Types": ["REGIONAL"]}


def test_request_authorizer_reads_the_auth_header_and_caches(synth):
    authorizer_id, authorizer = synth.one("AWS::ApiGateway::Authorizer")
    props = authorizer["Properties"]
    assert props["Type"] == "REQUEST"
    assert props["IdentitySource"] == f"method.request.header.{http.AUTH_HEADER}"
    assert props["AuthorizerResultTtlInSeconds"] == synth.config.authorizer_cache_seconds > 0
    fn = synth.logical_id(synth.stack.api.authorizer_function)
    assert fn in json.dumps(props["AuthorizerUri"])


def test_every_v1_route_goes_through_the_authorizer_to_the_api_lambda(synth):
    resources = synth.resources("AWS::ApiGateway::Resource")
    paths = {r["Properties"]["PathPart"] for r in resources.values()}
    assert paths == {http.API_PREFIX.strip("/"), "{proxy+}"}
    (method,) = synth.resources("AWS::ApiGateway::Method").values()  # only ANY /v1/{proxy+}
    props = method["Properties"]
    assert props["HttpMethod"] == "ANY"
    assert props["AuthorizationType"] == "CUSTOM"
    assert props["AuthorizerId"] == {"Ref": synth.one("AWS::ApiGateway::Authorizer")[0]}
    assert props["Integration"]["Type"] == "AWS_PROXY"
    assert synth.logical_id(synth.stack.api.api_function) in json.dumps(props["Integration"]["Uri"])


def test_gateway_rejections_answer_openai_401_envelope(synth):
    responses = {r["Properties"]["ResponseType"]: r["Properties"] for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()}
    for kind in ("UNAUTHORIZED", "ACCESS_DENIED"):
        assert responses[kind]["StatusCode"] == "401"
        assert json.loads(responses[kind]["ResponseTemplates"]["application/json"]) == UNAUTHORIZED_BODY
        assert responses[kind]["ResponseParameters"] == {"gatewayresponse.header.Content-Type": "'application/json'"}
    assert UNAUTHORIZED_BODY["error"]["code"] == "invalid_api_key"


def test_other_gateway_errors_use_the_openai_envelope_too(synth):
    responses = {r["Properties"]["ResponseType"]: r["Properties"] for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()}
    for kind, error_type in (("DEFAULT_4XX", "invalid_request_error"), ("DEFAULT_5XX", "server_error")):
        template = responses[kind]["ResponseTemplates"]["application/json"]
        # What API Gateway renders, with its message (a JSON string) substituted in.
        rendered = json.loads(template.replace("$context.error.messageString", json.dumps("Missing Authentication Token")))
        assert rendered == {
            "error": {"message": "Missing Authentication Token", "type": error_type, "param": None, "code": None}
        }


def test_stage_throttling_logging_tracing(synth):
    cfg = synth.config
    _, stage = synth.one("AWS::ApiGateway::Stage")
    props = stage["Properties"]
    assert props["StageName"] == names.API_STAGE == "prod"  # docs/deploy.md: .../prod/v1
    assert props["TracingEnabled"] is True
    (settings,) = props["MethodSettings"]
    assert settings["ThrottlingRateLimit"] == cfg.throttle.rate_limit
    assert settings["ThrottlingBurstLimit"] == cfg.throttle.burst_limit
    assert settings["LoggingLevel"] == "ERROR" and settings["DataTraceEnabled"] is False
    access = props["AccessLogSetting"]
    assert access["DestinationArn"]["Fn::GetAtt"][1] == "Arn"
    assert set(json.loads(access["Format"])) >= {"requestId", "status", "tenant", "path", "method"}
    synth.template.resource_count_is("AWS::ApiGateway::Account", 1)  # execution-logs role


def test_api_url_output_is_the_sdk_base_url(synth):
    parts = synth.json["Outputs"][names.OUTPUT_API_URL]["Value"]["Fn::Join"][1]
    # https://<api id>.execute-api.<region>.<suffix>/<stage>/v1
    assert parts[0] == "https://"
    assert parts[-2:] == [{"Ref": synth.one("AWS::ApiGateway::Stage")[0]}, http.API_PREFIX]
