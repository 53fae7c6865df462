"""REST API: binary media types, the authorizer, gateway responses in OpenAI's envelope, the stage."""

import json

import pytest

from functions.core import http
from functions.core.errors import DEACTIVATED_BODY, UNAUTHORIZED_BODY
from infra import names


def test_binary_media_types_come_from_the_http_contract(synth):
    _, api = synth.one("AWS::ApiGateway::RestApi")
    assert api["Properties"]["BinaryMediaTypes"] == list(http.BINARY_MEDIA_TYPES)
    # Every media type: a file's content reaches the SDK (Accept: application/binary), curl (*/*)
    # and a browser as bytes, never as the base64 text of the Lambda's answer (docs/local.md).
    assert api["Properties"]["BinaryMediaTypes"] == ["*/*"]
    assert api["Properties"]["EndpointConfiguration"] == {"Types": ["REGIONAL"]}


def test_request_authorizer_reads_the_auth_header_and_caches(synth):
    _authorizer_id, authorizer = synth.one("AWS::ApiGateway::Authorizer")
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
    responses = {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()
    }
    # A Deny comes only for a disabled tenant's key: OpenAI's deactivated-account answer.
    for kind, body in (("UNAUTHORIZED", UNAUTHORIZED_BODY), ("ACCESS_DENIED", DEACTIVATED_BODY)):
        assert responses[kind]["StatusCode"] == "401"
        assert json.loads(responses[kind]["ResponseTemplates"]["application/json"]) == body
        assert responses[kind]["ResponseParameters"] == {
            "gatewayresponse.header.Content-Type": "'application/json'",
            "gatewayresponse.header.x-request-id": "context.requestId",
        }
    assert UNAUTHORIZED_BODY["error"]["code"] == "invalid_api_key"
    assert DEACTIVATED_BODY["error"]["code"] == "account_deactivated"


def test_other_gateway_errors_use_the_openai_envelope_too(synth):
    responses = {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()
    }
    for kind, error_type in (("DEFAULT_4XX", "invalid_request_error"), ("DEFAULT_5XX", "server_error")):
        template = responses[kind]["ResponseTemplates"]["application/json"]
        # What API Gateway renders, with its message (a JSON string) substituted in.
        rendered = json.loads(
            template.replace("$context.error.messageString", json.dumps("Missing Authentication Token"))
        )
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


def test_api_url_is_the_stage_url(synth):
    # https://<api id>.execute-api.<region>.<suffix>/<stage>/v1: the SDK's base_url with the
    # streaming front off (tests/infra/test_stream_front.py), the distribution's origin with it on.
    parts = synth.stack.resolve(synth.stack.api.url)["Fn::Join"][1]
    assert parts[0] == "https://"
    assert parts[-2:] == [{"Ref": synth.one("AWS::ApiGateway::Stage")[0]}, http.API_PREFIX]


def _gateway_responses(synth):
    return {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()
    }


def _render(template: str, gateway_message: str) -> dict:
    """What API Gateway sends for a template: $context.error.messageString is its message as a JSON string."""
    return json.loads(template.replace("$context.error.messageString", json.dumps(gateway_message)))


def test_every_gateway_response_carries_the_request_id_and_json(synth):
    responses = _gateway_responses(synth)
    assert set(responses) >= {
        "UNAUTHORIZED",
        "ACCESS_DENIED",
        "AUTHORIZER_FAILURE",
        "AUTHORIZER_CONFIGURATION_ERROR",
        "THROTTLED",
        "QUOTA_EXCEEDED",
        "REQUEST_TOO_LARGE",
        "INTEGRATION_TIMEOUT",
        "DEFAULT_4XX",
        "DEFAULT_5XX",
    }
    for kind, props in responses.items():
        params = props["ResponseParameters"]
        assert params["gatewayresponse.header.x-request-id"] == "context.requestId", kind
        assert params["gatewayresponse.header.Content-Type"] == "'application/json'", kind
        body = _render(props["ResponseTemplates"]["application/json"], "API Gateway's message")
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, kind
        assert body["error"]["message"], kind


@pytest.mark.parametrize(
    ("kind", "code", "retry_after"),
    [("THROTTLED", "rate_limit_exceeded", "'1'"), ("QUOTA_EXCEEDED", "quota_exceeded", "'60'")],
)
def test_throttling_is_a_429_rate_limit_error_with_retry_after(synth, kind, code, retry_after):
    props = _gateway_responses(synth)[kind]
    assert props["StatusCode"] == "429"
    assert props["ResponseParameters"]["gatewayresponse.header.Retry-After"] == retry_after
    error = _render(props["ResponseTemplates"]["application/json"], "Too Many Requests")["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == code and error["param"] is None
    assert "Retry-After" in error["message"]


def test_a_request_over_api_gateways_10_mb_is_a_413_naming_the_uploads_api(synth):
    props = _gateway_responses(synth)["REQUEST_TOO_LARGE"]
    assert props["StatusCode"] == "413"
    error = _render(props["ResponseTemplates"]["application/json"], "Request Too Long")["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert str(10 * 1024 * 1024) in error["message"] and "client.uploads.upload_file_chunked" in error["message"]


def test_the_integration_timeout_is_a_504_in_the_envelope_and_the_lambda_gets_29_s(synth):
    props = _gateway_responses(synth)["INTEGRATION_TIMEOUT"]
    assert props["StatusCode"] == "504"
    error = _render(props["ResponseTemplates"]["application/json"], "Endpoint request timed out")["error"]
    assert error == {"message": "Endpoint request timed out", "type": "server_error", "param": None, "code": "timeout"}
    (method,) = synth.resources("AWS::ApiGateway::Method").values()
    assert method["Properties"]["Integration"]["TimeoutInMillis"] == 29_000
    fn = synth.resources("AWS::Lambda::Function")[synth.logical_id(synth.stack.api.api_function)]
    assert fn["Properties"]["Timeout"] == 29


@pytest.mark.parametrize("kind", ["AUTHORIZER_FAILURE", "AUTHORIZER_CONFIGURATION_ERROR"])
def test_a_failing_authorizer_is_a_500_server_error_not_a_401(synth, kind):
    props = _gateway_responses(synth)[kind]
    assert props["StatusCode"] == "500"
    error = _render(props["ResponseTemplates"]["application/json"], "null")["error"]
    assert error["type"] == "server_error" and "API key" in error["message"]
