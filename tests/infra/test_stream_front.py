"""The streaming front in the stack (infra/constructs/stream_front.py): one CloudFront distribution
whose streamed paths go to a VPC origin (an internal load balancer before a Fargate service) and
everything else to the API's stage, nothing cached and the bearer key forwarded; the service's port,
health check, environment and image; the network (no NAT, CloudFront's prefix list the only way
in); the task role's rights, evaluated as IAM evaluates them and against the front's real requests
on moto; the ``ApiUrl`` output; and the config that turns it all off or moves a custom domain."""

import fnmatch
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from functions.core import clients, http, schema
from functions.core.records import ApiKeyRecord
from functions.core.settings import Settings
from functions.core.tenants import TenantPolicy
from functions.stream_front.__main__ import API_ORIGIN_ENV
from functions.stream_front.server import HEALTH_PATH, PORT
from functions.webhooks.store import webhooks_pk
from infra import names
from infra.app import build
from infra.config import CONTEXT_KEY, DeployConfig, parse
from infra.constructs import stream_front as front_construct
from tests.infra.conftest import CONFIG, Synth
from tests.infra.test_api_access import granted
from tests.infra.test_table_access import _operation_keys, _table_statements

from .test_lambdas import expected_settings_env

#: CloudFront's managed origin request policy AllViewerExceptHostHeader (its documented id).
ALL_VIEWER_EXCEPT_HOST_HEADER = "b689b0a8-53d0-40ab-baf2-68738e2966ac"
CERTIFICATE = "arn:aws:acm:us-east-1:123456789012:certificate/0a1b2c3d-0000-4000-8000-000000000000"
REGIONAL_CERTIFICATE = "arn:aws:acm:eu-west-1:123456789012:certificate/0a1b2c3d-0000-4000-8000-000000000001"
KEY_HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def _synth(tmp_path_factory: pytest.TempPathFactory, name: str, config: dict[str, Any]) -> Synth:
    outdir = tmp_path_factory.mktemp(name)
    app, stack = build({CONTEXT_KEY: config}, outdir=str(outdir))
    path = Path(app.synth().get_stack_by_name(stack.stack_name).template_full_path)
    data = json.loads(path.read_text())
    return Synth(stack=stack, template=Template.from_json(data), json=data, template_path=path, outdir=outdir)


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The path turned off, with a custom domain (which then stays on API Gateway)."""
    domain = {"name": "batch.example.com", "certificate_arn": REGIONAL_CERTIFICATE}
    return _synth(tmp_path_factory, "cdk.out.front-off", CONFIG | {"stream_front": False, "domain": domain})


@pytest.fixture(scope="module")
def on_domain(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The path on with a custom domain: the distribution's, with its us-east-1 certificate."""
    domain = {"name": "batch.example.com", "certificate_arn": REGIONAL_CERTIFICATE}
    return _synth(
        tmp_path_factory,
        "cdk.out.front-domain",
        CONFIG
        | {
            "domain": domain,
            "stream_front": {"certificate_arn": CERTIFICATE, "architecture": "arm64", "max_tasks": 1},
        },
    )


def _distribution(synth: Synth) -> dict[str, Any]:
    return synth.one("AWS::CloudFront::Distribution")[1]["Properties"]["DistributionConfig"]


def _origins(synth: Synth) -> dict[str, dict[str, Any]]:
    return {o["Id"]: o for o in _distribution(synth)["Origins"]}


# --- the distribution ------------------------------------------------------------------------------
def test_the_streamed_paths_go_to_the_vpc_origin_and_the_rest_to_the_api_stage(synth):
    config = _distribution(synth)
    origins = _origins(synth)
    vpc_origin_id, _ = synth.one("AWS::CloudFront::VpcOrigin")
    behaviors = {b["PathPattern"]: b for b in config["CacheBehaviors"]}
    assert (
        list(behaviors)
        == list(front_construct.STREAMED_PATHS)
        == ["/v1/files", "/v1/files/*/content", "/v1/uploads/*/parts"]
    )
    for behavior in behaviors.values():
        origin = origins[behavior["TargetOriginId"]]
        assert origin["VpcOriginConfig"]["VpcOriginId"] == {"Fn::GetAtt": [vpc_origin_id, "Id"]}
        assert (
            origin["VpcOriginConfig"]["OriginReadTimeout"]
            == synth.config.stream_front.origin_read_timeout_seconds
            == 60
        )
        assert origin["VpcOriginConfig"]["OriginKeepaliveTimeout"] == 60
        assert origin["DomainName"] == {
            "Fn::GetAtt": [synth.logical_id(synth.stack.stream_front.load_balancer), "DNSName"]
        }
    default = origins[config["DefaultCacheBehavior"]["TargetOriginId"]]
    assert "VpcOriginConfig" not in default and default["CustomOriginConfig"]["OriginProtocolPolicy"] == "https-only"
    # https://<api id>.execute-api.<region>.<suffix>/<stage>/ split into its host and /<stage>
    stage_url = synth.render(default["DomainName"]["Fn::Select"][1]["Fn::Split"][1])
    assert (
        stage_url
        == f"https://<{synth.logical_id(synth.stack.api.rest_api)}>.execute-api.<AWS::Region>.<AWS::URLSuffix>/"
        f"<{synth.one('AWS::ApiGateway::Stage')[0]}>/"
    )
    assert default["OriginPath"]["Fn::Join"][1][0] == "/"
    (vpc_origin,) = synth.resources("AWS::CloudFront::VpcOrigin").values()
    endpoint = vpc_origin["Properties"]["VpcOriginEndpointConfig"]
    assert endpoint["Arn"] == {"Ref": synth.logical_id(synth.stack.stream_front.load_balancer)}
    assert (endpoint["OriginProtocolPolicy"], endpoint["HTTPPort"]) == ("http-only", front_construct.LISTENER_PORT)


def test_nothing_is_cached_every_method_passes_and_the_bearer_key_is_forwarded(synth):
    config = _distribution(synth)
    ((policy_id, policy),) = synth.resources("AWS::CloudFront::CachePolicy").items()
    for behavior in (config["DefaultCacheBehavior"], *config["CacheBehaviors"]):
        assert behavior["CachePolicyId"] == {"Ref": policy_id}
        assert behavior["OriginRequestPolicyId"] == ALL_VIEWER_EXCEPT_HOST_HEADER  # every viewer header but Host
        assert set(behavior["AllowedMethods"]) == {"GET", "HEAD", "OPTIONS", "PUT", "PATCH", "POST", "DELETE"}
        assert behavior["ViewerProtocolPolicy"] == "https-only" and behavior["Compress"] is False
    cache = policy["Properties"]["CachePolicyConfig"]
    # CloudFront strips Authorization from GET/HEAD unless it is in the cache key, and a policy with
    # every TTL 0 may not name a header: TTLs 0/0/1, the key (and the query string) in the key.
    assert (cache["MinTTL"], cache["DefaultTTL"], cache["MaxTTL"]) == (0, 0, 1)
    keyed = cache["ParametersInCacheKeyAndForwardedToOrigin"]
    assert (
        keyed["HeadersConfig"] == {"HeaderBehavior": "whitelist", "Headers": [http.AUTH_HEADER]}
        and http.AUTH_HEADER == "Authorization"
    )
    assert keyed["QueryStringsConfig"] == {"QueryStringBehavior": "all"}
    # Error answers are never cached either (CloudFront's default is 10 s).
    assert {(e["ErrorCode"], e["ErrorCachingMinTTL"]) for e in config["CustomErrorResponses"]} == {
        (code, 0) for code in front_construct.ERROR_CODES
    }
    assert all(
        set(e) == {"ErrorCode", "ErrorCachingMinTTL"} for e in config["CustomErrorResponses"]
    )  # bodies as they came


def test_the_distribution_speaks_http2_and_logs_every_request(synth):
    config = _distribution(synth)
    assert (config["HttpVersion"], config["IPV6Enabled"], config["Enabled"]) == ("http2", True, True)
    assert config["Logging"]["Bucket"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.stream_front.log_bucket), "RegionalDomainName"]
    }
    assert "WebACLId" not in config  # a CloudFront web ACL is the deployment's choice (stream_front.web_acl_arn)
    assert "Aliases" not in config and "ViewerCertificate" not in config  # *.cloudfront.net without a domain


def test_the_output_url_is_the_distribution(synth):
    value = synth.json["Outputs"][names.OUTPUT_API_URL]["Value"]
    assert value == {
        "Fn::Join": [
            "",
            [
                "https://",
                {"Fn::GetAtt": [synth.one("AWS::CloudFront::Distribution")[0], "DomainName"]},
                http.API_PREFIX,
            ],
        ]
    }


# --- the service -----------------------------------------------------------------------------------
def test_the_service_listens_on_the_fronts_port_behind_a_health_check(synth):
    (service,) = [
        r["Properties"] for k, r in synth.resources("AWS::ECS::Service").items() if k.startswith("StreamFront")
    ]
    assert service["LaunchType"] == "FARGATE" and service["DesiredCount"] == synth.config.stream_front.min_tasks == 1
    assert service["LoadBalancers"] == [
        {
            "ContainerName": "Front",
            "ContainerPort": PORT,
            "TargetGroupArn": {"Ref": synth.one("AWS::ElasticLoadBalancingV2::TargetGroup")[0]},
        }
    ]
    deployment = service["DeploymentConfiguration"]
    assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
    assert (deployment["MinimumHealthyPercent"], deployment["MaximumPercent"]) == (100, 200)
    network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "ENABLED"  # egress without a NAT gateway
    public = {synth.logical_id(s) for s in synth.stack.stream_front.vpc.public_subnets}
    assert {s["Ref"] for s in network["Subnets"]} == public

    _, group = synth.one("AWS::ElasticLoadBalancingV2::TargetGroup")
    group = group["Properties"]
    assert (group["Port"], group["Protocol"], group["TargetType"]) == (PORT, "HTTP", "ip")
    assert (group["HealthCheckPath"], group["Matcher"]) == (
        HEALTH_PATH,
        {"HttpCode": "200"},
    ) and HEALTH_PATH == "/healthz"
    attributes = {a["Key"]: a["Value"] for a in group["TargetGroupAttributes"]}
    assert attributes["deregistration_delay.timeout_seconds"] == "300"
    assert attributes["load_balancing.algorithm.type"] == "least_outstanding_requests"


def test_the_task_runs_the_front_with_the_deployments_settings(synth):
    (task,) = [
        r["Properties"] for k, r in synth.resources("AWS::ECS::TaskDefinition").items() if k.startswith("StreamFront")
    ]
    assert (task["Cpu"], task["Memory"], task["NetworkMode"]) == ("512", "1024", "awsvpc")
    assert task["RuntimePlatform"] == {"CpuArchitecture": "X86_64", "OperatingSystemFamily": "LINUX"}
    assert task["RequiresCompatibilities"] == ["FARGATE"]
    (container,) = task["ContainerDefinitions"]
    assert container["PortMappings"] == [{"ContainerPort": PORT, "Protocol": "tcp"}]
    assert container["ReadonlyRootFilesystem"] is True and container["StopTimeout"] == 60
    env = {e["Name"]: synth.render(e["Value"]) for e in container["Environment"]}
    assert {k: v for k, v in env.items() if k.startswith("BATCHAPI_")} == expected_settings_env(synth)  # the Lambdas'
    assert env[API_ORIGIN_ENV] == (
        f"https://<{synth.logical_id(synth.stack.api.rest_api)}>.execute-api.<AWS::Region>.<AWS::URLSuffix>/{names.API_STAGE}"
    )
    assert set(env) - {k for k in env if k.startswith("BATCHAPI_")} == {
        API_ORIGIN_ENV,
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    }
    assert env["AWS_REGION"] == "<AWS::Region>"


def test_the_image_is_built_from_its_dockerfile_with_functions_only(synth):
    manifest = json.loads((synth.outdir / f"{synth.stack.stack_name}.assets.json").read_text())
    (image,) = [i for i in manifest["dockerImages"].values() if i["source"]["dockerFile"] == front_construct.DOCKERFILE]
    assert image["source"]["platform"] == "linux/amd64"
    staged = synth.outdir / image["source"]["directory"]
    files = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
    assert {
        front_construct.DOCKERFILE,
        "functions/stream_front/__main__.py",
        "functions/api/files.py",
        "pyproject.toml",
    } <= files
    assert {f.split("/")[0] for f in files} == {"functions", "pyproject.toml"}
    assert not {f for f in files if "__pycache__" in f or f.endswith(".pyc")}
    dockerfile = (staged / front_construct.DOCKERFILE).read_text()
    assert "FROM ${PYTHON_IMAGE}" in dockerfile and "ARG PYTHON_IMAGE=python:3.12-slim" in dockerfile
    assert "USER 10001" in dockerfile and 'CMD ["python", "-m", "functions.stream_front"]' in dockerfile
    assert "['project']['dependencies']" in dockerfile and ".[" not in dockerfile  # no extras


def test_the_service_scales_on_cpu_between_its_bounds(synth):
    (target,) = synth.resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    front = synth.config.stream_front
    assert (target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"]) == (
        front.min_tasks,
        front.max_tasks,
    )
    (policy,) = synth.resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()
    tracking = policy["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "ECSServiceAverageCPUUtilization"


# --- the network -----------------------------------------------------------------------------------
def test_the_load_balancer_is_internal_and_only_cloudfront_reaches_it(synth):
    front = synth.stack.stream_front
    _, alb = synth.one("AWS::ElasticLoadBalancingV2::LoadBalancer")
    alb = alb["Properties"]
    assert alb["Scheme"] == "internal"
    isolated = {synth.logical_id(s) for s in front.vpc.isolated_subnets}
    assert {s["Ref"] for s in alb["Subnets"]} == isolated and len(isolated) == 2
    attributes = {a["Key"]: a["Value"] for a in alb["LoadBalancerAttributes"]}
    assert attributes["idle_timeout.timeout_seconds"] == "90"
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    (listener,) = synth.resources("AWS::ElasticLoadBalancingV2::Listener").values()
    assert (listener["Properties"]["Port"], listener["Properties"]["Protocol"]) == (80, "HTTP")

    alb_sg, task_sg = synth.logical_id(front.alb_security_group), synth.logical_id(front.task_security_group)
    ingress = [r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroupIngress").values()]
    to_alb = [r for r in ingress if r["GroupId"] == {"Fn::GetAtt": [alb_sg, "GroupId"]}]
    (mapping,) = [m for m in synth.json["Mappings"] if m.startswith("StreamFrontOriginFacingPrefixLists")]
    assert to_alb == [
        {
            "Description": "CloudFront origin-facing (VPC origin)",
            "FromPort": 80,
            "ToPort": 80,
            "IpProtocol": "tcp",
            "GroupId": {"Fn::GetAtt": [alb_sg, "GroupId"]},
            "SourcePrefixListId": {"Fn::FindInMap": [mapping, {"Ref": "AWS::Region"}, "PrefixListId"]},
        }
    ]
    assert synth.json["Mappings"][mapping]["us-east-1"] == {"PrefixListId": "pl-3b927c52"}
    to_tasks = [r for r in ingress if r["GroupId"] == {"Fn::GetAtt": [task_sg, "GroupId"]}]
    assert [(r["SourceSecurityGroupId"], r["FromPort"], r["ToPort"]) for r in to_tasks] == [
        ({"Fn::GetAtt": [alb_sg, "GroupId"]}, PORT, PORT)
    ]
    groups = synth.resources("AWS::EC2::SecurityGroup")
    assert (
        "SecurityGroupIngress" not in groups[alb_sg]["Properties"]
        and "SecurityGroupIngress" not in groups[task_sg]["Properties"]
    )
    assert groups[task_sg]["Properties"]["SecurityGroupEgress"] == [
        {
            "CidrIp": "0.0.0.0/0",
            "Description": "HTTPS to AWS APIs and the API",
            "FromPort": 443,
            "IpProtocol": "tcp",
            "ToPort": 443,
        }
    ]


def test_the_network_has_no_nat_and_gateway_endpoints_only(synth):
    front = synth.stack.stream_front
    assert not synth.resources("AWS::EC2::NatGateway") and not synth.resources("AWS::EC2::EIP")
    subnets = {k: r for k, r in synth.resources("AWS::EC2::Subnet").items() if k.startswith("StreamFront")}
    assert len(subnets) == 4 and len(front.vpc.public_subnets) == 2 and len(front.vpc.isolated_subnets) == 2
    endpoints = [
        e["Properties"] for k, e in synth.resources("AWS::EC2::VPCEndpoint").items() if k.startswith("StreamFront")
    ]
    assert {synth.render(e["ServiceName"]).rsplit(".", 1)[-1] for e in endpoints} == {"s3", "dynamodb"}
    assert all(e.get("VpcEndpointType", "Gateway") == "Gateway" for e in endpoints)  # free
    # The isolated subnets (the load balancer, CloudFront's interfaces) have no route out.
    routes = [r["Properties"] for r in synth.resources("AWS::EC2::Route").values()]
    assert all("GatewayId" in r for r in routes)  # only the public subnets' default routes, to the internet gateway
    assert len([r for r in routes if "StreamFront" in json.dumps(r)]) == 2


# --- the task role ---------------------------------------------------------------------------------
def _front_statements(synth: Synth) -> list[dict]:
    return _table_statements(synth, synth.logical_id(synth.stack.stream_front.task_role))


def test_the_task_role_reads_keys_and_policies_and_writes_only_its_own_partitions(synth):
    statements = _front_statements(synth)
    key = ApiKeyRecord(key_hash=KEY_HASH, tenant="acme", created_at=1, hint="abcd")
    policy_pk = TenantPolicy(tenant="acme").to_item()[schema.PK]
    assert granted(statements, "dynamodb:GetItem", [key.keys()[schema.PK]])
    assert granted(statements, "dynamodb:GetItem", [policy_pk])
    own = (schema.tenant_pk("acme"), schema.requests_pk("acme"), schema.stored_pk("acme"))
    for pk in own:
        for action in front_construct.FRONT_ITEM_ACTIONS:
            assert granted(statements, action, [pk]), (action, pk)
    # Never a write of a key (or its listing or id), a policy, a batch, a budget, an audit item.
    others = (
        key.keys()[schema.PK],
        key.listing_item()[schema.PK],
        key.id_item()[schema.PK],
        policy_pk,
        schema.batches_pk("acme"),
        schema.creations_pk("acme"),
        schema.budget_pk("acme"),
        schema.enqueued_pk("acme"),
        schema.chunks_pk("acme", "batch_x"),
        schema.audit_pk("acme"),
        webhooks_pk("acme"),
        "IDEMPOTENCY#k",
    )
    for pk in others:
        for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"):
            assert not granted(statements, action, [pk]), (action, pk)
    for pk in (
        key.listing_item()[schema.PK],
        key.id_item()[schema.PK],
        schema.batches_pk("acme"),
        schema.audit_pk("acme"),
    ):
        assert not granted(statements, "dynamodb:GetItem", [pk]), pk
    # A transaction naming a key item beside a file record is denied as a whole.
    assert not granted(statements, "dynamodb:PutItem", [schema.tenant_pk("acme"), key.keys()[schema.PK]])
    # No Scan, Query, batch operation or index at all.
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions <= {"dynamodb:GetItem", *front_construct.FRONT_ITEM_ACTIONS}
    assert all("Condition" in s for s in statements)
    assert all(s["Resource"] == {"Fn::GetAtt": [synth.one("AWS::DynamoDB::Table")[0], "Arn"]} for s in statements)


def test_the_task_role_reaches_this_buckets_files_and_parts_and_the_audit_queue_only(synth):
    role = synth.logical_id(synth.stack.stream_front.task_role)
    pairs = {(a, synth.render(json.loads(r))) for a, r in synth.permissions(role)}
    bucket = f"<{synth.logical_id(synth.stack.storage.bucket)}.Arn>"
    s3 = {(a, r) for a, r in pairs if a.startswith("s3:")}
    assert {r for _, r in s3} == {bucket, f"{bucket}/files/*", f"{bucket}/uploads/*"}
    assert {a for a, r in s3 if r == bucket} <= {
        "s3:GetBucket*",
        "s3:List*",
        "s3:GetObject*",
    }  # grant_read's bucket half
    for pattern in ("files/*", "uploads/*"):
        assert {"s3:PutObject", "s3:Abort*", "s3:DeleteObject*"} <= {a for a, r in s3 if r == f"{bucket}/{pattern}"}
    assert ("s3:GetObject*", f"{bucket}/files/*") in s3 and ("s3:GetObject*", f"{bucket}/uploads/*") not in s3
    sqs = {(a, r) for a, r in pairs if a.startswith("sqs:")}
    assert sqs == {("sqs:SendMessage", f"<{synth.logical_id(synth.stack.audit.queue)}.Arn>")}
    services = {a.split(":")[0] for a, _ in pairs}
    assert services == {"dynamodb", "s3", "sqs"}


# --- the front's real requests on moto --------------------------------------------------------------
from tests.integration.conftest import aws, deployed, keys, stores  # noqa: E402 - fixtures

_S3_ACTIONS = {
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "PutObject": "s3:PutObject",
    "AbortMultipartUpload": "s3:Abort*",
    "GetObject": "s3:GetObject*",
    "HeadObject": "s3:GetObject*",
    "DeleteObject": "s3:DeleteObject*",
}


class Recorder:
    """DynamoDB and S3 requests made off the API Lambda's thread (the local front runs the API
    Lambda on a thread named ``api-lambda``; the streamed routes on the request's own thread)."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, params: dict[str, Any], model: Any, **kwargs: Any) -> None:
        if self.on and threading.current_thread().name != "api-lambda":
            self.calls.append((kwargs["event_name"].split(".")[1], model.name, params))


def test_every_request_of_the_streamed_routes_is_allowed(synth, aws: Settings, keys, stores, deployed):
    import openai

    from functions.api import handler as api_handler
    from functions.authorizer import handler as authorizer_handler
    from functions.core import deps
    from functions.stream_front.routes import StreamFront
    from infra.local.front import LocalApi, make_server

    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=1000, max_stored_bytes=64 * 1024 * 1024))
    recorder = Recorder()
    for boto, service in (
        (clients.dynamodb_table(deployed.table_name).meta.client, "dynamodb"),
        (clients.client("dynamodb"), "dynamodb"),
        (clients.client("s3"), "s3"),
    ):
        boto.meta.events.register(f"provide-client-params.{service}.*", recorder)
    server = make_server(
        LocalApi(
            api_handler.handler, authorizer_handler.handler, stream=StreamFront(deps.stores, deps.settings(), deps.now)
        ),
        "127.0.0.1",
        0,
    )
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key=keys["acme"], max_retries=0
        )
        upload = client.uploads.create(
            bytes=6 * 1024 * 1024, filename="u.jsonl", mime_type="text/jsonl", purpose="batch"
        )
        recorder.on = True
        data = b'{"a": 1}\n' * (1100 * 1024)  # over one 8 MiB S3 part: a multipart upload
        created = client.files.create(file=("big.jsonl", data), purpose="user_data")
        assert client.files.content(created.id).read() == data
        with pytest.raises(openai.BadRequestError):  # refused after its bytes were streamed: removed
            client.files.create(file=("bad.txt", b"x" * 10), purpose="not-a-purpose")  # type: ignore[arg-type]
        part = client.uploads.parts.create(upload.id, data=b"y" * (6 * 1024 * 1024))
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=str(client.base_url), api_key="sk-nope", max_retries=0).files.create(
                file=("n.txt", b"n"), purpose="user_data"
            )
        recorder.on = False
        assert part.id
    finally:
        server.shutdown()
        server.server_close()

    statements = _front_statements(synth)
    table = [
        (a, k)
        for service, op, params in recorder.calls
        if service == "dynamodb"
        for a, k in _operation_keys(op, params)
    ]
    assert table and [(a, k) for a, k in table if not granted(statements, a, k)] == []
    touched = {k for _, ks in table for k in ks}
    for pk in (schema.tenant_pk("acme"), schema.requests_pk("acme"), schema.stored_pk("acme")):
        assert pk in touched, pk
    assert any(k.startswith("KEY#") for k in touched)

    role = synth.logical_id(synth.stack.stream_front.task_role)
    pairs = {(a, synth.render(json.loads(r))) for a, r in synth.permissions(role)}
    bucket = f"<{synth.logical_id(synth.stack.storage.bucket)}.Arn>"
    objects = [(op, params["Key"]) for service, op, params in recorder.calls if service == "s3"]
    assert {op for op, _ in objects} >= {"CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "GetObject"}
    for op, key in objects:
        assert params_allowed(pairs, bucket, _S3_ACTIONS[op], key), (op, key)


def params_allowed(pairs: set[tuple[str, str]], bucket: str, action: str, key: str) -> bool:
    return any(
        a == action and r.startswith(f"{bucket}/") and fnmatch.fnmatchcase(key, r.removeprefix(f"{bucket}/"))
        for a, r in pairs
    )


# --- the config --------------------------------------------------------------------------------------
def test_turned_off_there_is_no_distribution_and_the_url_is_api_gateways(off):
    for type_ in (
        "AWS::CloudFront::Distribution",
        "AWS::CloudFront::VpcOrigin",
        "AWS::CloudFront::CachePolicy",
        "AWS::ElasticLoadBalancingV2::LoadBalancer",
        "AWS::ECS::TaskDefinition",
        "AWS::ApplicationAutoScaling::ScalableTarget",
    ):
        assert not [k for k in off.resources(type_) if not k.startswith("Workers")], type_
    assert [k for k in off.resources("AWS::ECS::Service")] == [
        k for k in off.resources("AWS::ECS::Service") if k.startswith("Workers")
    ]
    assert not [k for k in off.json["Resources"] if k.startswith("StreamFront")]
    assert off.stack.stream_front is None
    # The custom domain stays on API Gateway (its regional certificate): the URL is the domain's.
    ((domain_id, domain),) = off.resources("AWS::ApiGateway::DomainName").items()
    assert domain["Properties"]["DomainName"] == "batch.example.com"
    assert domain["Properties"]["RegionalCertificateArn"] == REGIONAL_CERTIFICATE
    # (A DomainName's Ref is its domain name.)
    assert off.json["Outputs"][names.OUTPUT_API_URL]["Value"] == {
        "Fn::Join": ["", ["https://", {"Ref": domain_id}, http.API_PREFIX]]
    }


def test_with_a_domain_the_distribution_serves_it_with_tls_1_2(on_domain):
    config = _distribution(on_domain)
    assert config["Aliases"] == ["batch.example.com"]
    assert config["ViewerCertificate"] == {
        "AcmCertificateArn": CERTIFICATE,
        "MinimumProtocolVersion": "TLSv1.2_2021",
        "SslSupportMethod": "sni-only",
    }
    assert not on_domain.resources("AWS::ApiGateway::DomainName")  # API Gateway keeps its execute-api URL only
    assert on_domain.json["Outputs"][names.OUTPUT_API_URL]["Value"] == f"https://batch.example.com{http.API_PREFIX}"
    (task,) = [
        r["Properties"]
        for k, r in on_domain.resources("AWS::ECS::TaskDefinition").items()
        if k.startswith("StreamFront")
    ]
    assert task["RuntimePlatform"]["CpuArchitecture"] == "ARM64"
    assert not on_domain.resources("AWS::ApplicationAutoScaling::ScalableTarget")  # min = max: no scaling
    manifest = json.loads((on_domain.outdir / f"{on_domain.stack.stack_name}.assets.json").read_text())
    (image,) = [i for i in manifest["dockerImages"].values() if i["source"]["dockerFile"] == front_construct.DOCKERFILE]
    assert image["source"]["platform"] == "linux/arm64"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"domain": {"name": "a.example.com", "certificate_arn": REGIONAL_CERTIFICATE}},
            "stream_front.certificate_arn",
        ),
        ({"stream_front": {"certificate_arn": CERTIFICATE}}, "set domain too"),
        ({"stream_front": {"certificate_arn": REGIONAL_CERTIFICATE}}, "us-east-1"),  # CloudFront reads us-east-1 only
        ({"stream_front": {"min_tasks": 2, "max_tasks": 1}}, "max_tasks < min_tasks"),
        ({"stream_front": {"min_tasks": 0}}, "greater than or equal to 1"),
        ({"stream_front": {"cpu": 512, "memory_mib": 512}}, "memory_mib"),
        ({"stream_front": {"web_acl_arn": "arn:aws:wafv2:eu-west-1:123456789012:regional/webacl/x/y"}}, "web_acl_arn"),
        ({"stream_front": {"origin_read_timeout_seconds": 181}}, "origin_read_timeout_seconds"),
    ],
)
def test_invalid_stream_front_configs_are_rejected(raw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        DeployConfig.model_validate(raw)


def test_the_default_config_has_the_path_on_and_false_or_null_turns_it_off():
    assert DeployConfig().stream_front is not None and DeployConfig().stream_front.min_tasks == 1
    assert DeployConfig.model_validate({"stream_front": False}).stream_front is None
    assert DeployConfig.model_validate({"stream_front": None}).stream_front is None
    assert parse('{"stream_front": null}').stream_front is None  # a JSON string keeps its nulls
    with pytest.raises(ValueError):
        DeployConfig.model_validate({"stream_front": True})  # on is an object (or nothing)
    domain = {"name": "a.example.com", "certificate_arn": REGIONAL_CERTIFICATE}
    assert DeployConfig.model_validate({"stream_front": None, "domain": domain}).api_domain.name == "a.example.com"
    on = DeployConfig.model_validate({"domain": domain, "stream_front": {"certificate_arn": CERTIFICATE}})
    assert on.api_domain is None


def test_every_origin_facing_prefix_list_id_has_the_shape_of_one():
    assert all(pl.startswith("pl-") and len(pl) == 11 for pl in front_construct.ORIGIN_FACING_PREFIX_LISTS.values())
