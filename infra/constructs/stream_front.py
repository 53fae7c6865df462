"""The streaming front: the deployment's one public entry, a CloudFront distribution, in front of
the API, so that ``files.create`` of up to 512 MB (200 MB for ``purpose=batch``) and 64 MB
``uploads.parts.create`` work with the unchanged SDK. API Gateway (10 MB a request) and Lambda
(6 MB) cannot carry those bodies; ``functions/stream_front`` streams them into S3 instead.

Behaviours (``STREAMED_PATHS``): ``/v1/files``, ``/v1/files/*/content`` and ``/v1/uploads/*/parts``
go to the front, an ECS Fargate service (``python -m functions.stream_front``, image
``functions/stream_front/Dockerfile``, built by CDK at deploy) behind an **internal** Application
Load Balancer, which CloudFront reaches through a **VPC origin** (the load balancer has no public
address). Everything else (the default behaviour) goes to the REST API's stage
(``https://<id>.execute-api.<region>.amazonaws.com/prod``). The front relays the requests on its
paths that it does not stream (``GET /v1/files``) to that same stage
(``STREAM_FRONT_API_ORIGIN``). The stack's ``ApiUrl`` output is ``https://<distribution>/v1``.
``DeployConfig.stream_front = false`` removes all of it (no distribution, VPC, load balancer or task:
nothing that bills while idle) and the output is API Gateway's URL, with its 10 MB quota.

Facts this design rests on (AWS documentation):

- Request bodies: CloudFront's quotas limit a request's headers, URL and query string to 20,480
  bytes "not including the body content", and list no quota on the body itself
  (https://docs.aws.amazon.com/AmazonCloudFront/latest/DeveloperGuide/cloudfront-limits.html,
  "General quotas"); the limits on bodies are those of what inspects them: AWS WAF reads at most
  the first 16-64 KB of a body (``RequestBodyAssociatedResourceTypeConfig``), Lambda@Edge and
  field-level encryption, neither used here. 512 MB passes; the front itself bounds every body
  (``functions/stream_front/routes.py``). A web ACL on the distribution must not block bodies
  over its inspection size (the AWS managed core rule set's ``SizeRestrictions_BODY`` does: set
  that rule to count or scope it off the streamed paths).
- Origin timeouts: the response (origin read) timeout is how long CloudFront waits for the
  origin's first response byte and between two response packets; 1-60 s by default, more after a
  raise of the "Response timeout per origin" quota
  (https://repost.aws/knowledge-center/cloudfront-custom-origin-response). CloudFront does not
  retry a POST or PUT that timed out. The front answers an upload only once its body has ended
  (it streams the body into S3 as it arrives, so the answer follows the last byte by one part's
  upload and the commit, about a second). AWS does not document whether CloudFront starts the
  response timer before the viewer's body has arrived whole; public reports of uploads cut at
  60 s through CloudFront exist, so a 200 MB ``files.create`` over a link slower than about
  3.5 MB/s (200 MB / 60 s) may need the quota raise (``origin_read_timeout_seconds``) or the
  Uploads API (64 MB parts, each its own request). The keep-alive timeout (default 5 s, at most
  60 s without a raise) is 60 s, below the load balancer's idle timeout (``ALB_IDLE_TIMEOUT``), so
  the load balancer never closes a connection CloudFront is about to reuse.
- Authorization: CloudFront removes the ``Authorization`` header from GET and HEAD requests unless
  it is part of the cache key, and refuses an origin request policy that names it
  (https://docs.aws.amazon.com/AmazonCloudFront/latest/DeveloperGuide/RequestAndResponseBehaviorCustomOrigin.html,
  "HTTP request headers and CloudFront behavior";
  https://repost.aws/knowledge-center/cloudfront-authorization-header); a cache policy with every
  TTL 0 may not name a header (aws/aws-cdk#13441, #16977). So every behaviour has ``no_cache``:
  the bearer key (and the query string) in the cache key, minimum and default TTL 0, maximum 1 s;
  the API sends no ``Cache-Control``, so nothing is cached, and anything cached would be keyed by
  the caller's key. The managed origin request policy ``AllViewerExceptHostHeader`` forwards every
  other viewer header (``Content-Type``, ``Content-Length``, ``Idempotency-Key``...), cookies and
  the query string, without the viewer's ``Host`` (API Gateway routes on its own host name). Error
  responses are never cached (``ERROR_CODES``: CloudFront caches 4xx/5xx for 10 s by default).
- VPC origins (https://docs.aws.amazon.com/AmazonCloudFront/latest/DeveloperGuide/private-content-vpc-origins.html):
  the origin is an internal ALB (or NLB, EC2) in a private subnet of a VPC in the distribution's
  account; the VPC needs an internet gateway attached (CloudFront's traffic does not route through
  it) and free IPv4 addresses in the origin's subnets for the elastic network interfaces CloudFront
  places there (``AWSCloudFrontVPCOriginServiceRolePolicy``); some zones are not supported (e.g.
  use1-az3: ``StreamFrontConfig.availability_zones``). The origin's security group admits CloudFront
  by the managed prefix list ``com.amazonaws.global.cloudfront.origin-facing`` (or, once the VPC
  origin exists, the ``CloudFront-VPCOrigins-Service-SG`` group CloudFront creates; not known at
  deploy time, so the prefix list it is). The load balancer is internal: only VPC origins of this
  account can reach it at all. CloudFormation cannot look the list's id up, so the region's id
  comes from ``ORIGIN_FACING_PREFIX_LISTS`` (or ``StreamFrontConfig.cloudfront_prefix_list_id``).

Network: a VPC of its own (the GPU workers' has public subnets only, and may be the operator's): two
zones, each with a public subnet (the tasks; an internet gateway) and an isolated one (the load
balancer and CloudFront's interfaces: no route out). No NAT gateway and no interface endpoints:
the tasks have public IPs for their egress (ECR, CloudWatch Logs, SQS, and the API's public
execute-api host, which the relay needs and an execute-api endpoint would hide) and accept traffic
only from the load balancer's security group; S3 and DynamoDB go through gateway endpoints (free).

Load balancer: HTTP on port 80 inside the VPC. CloudFront ends TLS at the edge; the hop from its
interfaces to the load balancer stays inside this VPC, and HTTPS there would need a certificate
for a name that resolves to an internal load balancer (a custom domain's own regional
certificate), which a default deployment does not have. Idle timeout ``ALB_IDLE_TIMEOUT`` (an idle
timeout: a 200 MB body that keeps flowing never trips it), shorter than the server's socket timeout
(``functions.stream_front.server.SOCKET_TIMEOUT_SECONDS``) so the load balancer closes first;
deregistration delay ``DEREGISTRATION_DELAY`` so a deployment lets uploads in flight finish (ECS
stops a task only after its target drained). No access logs of its own: the distribution's standard
logs (a bucket of this construct) record every request it forwards here, with the origin's status,
the bytes each way and the time taken (the front logs no requests itself; each is in the audit
trail too). The load balancer's would need its region's log-delivery account at synth, which an
environment-agnostic stack does not know.

Custom domain (``DeployConfig.domain``): with the front on, the domain is the distribution's
(``StreamFrontConfig.certificate_arn``, an ACM certificate in us-east-1, is required; viewers then
get TLS 1.2 at least: ``TLS_V1_2_2021``) and API Gateway keeps only its execute-api URL (the
distribution's origin); with the front off, the domain stays on API Gateway (its regional
certificate). Without a domain, viewers connect to ``*.cloudfront.net``, where CloudFront's own
certificate fixes the minimum protocol at TLSv1 (AwsSolutions-CFR4 acknowledged).

The task role has the API Lambda's rights on what the front touches, and less: GetItem on API key
items (``KEY#``) and tenant policies (``TENANTS``); on a tenant's own partition (files, uploads,
parts) and its request and stored-bytes counters, GetItem, PutItem, UpdateItem, DeleteItem
(``FRONT_WRITE_PARTITIONS``): never a key, a policy, a batch, a budget or an audit item; no Query,
Scan, batch operation or index. S3: write, read and delete objects under ``files/`` and
``uploads/`` of this bucket only; SQS: SendMessage on the audit queue (granted by the stack).
"""

from typing import Final

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_cloudfront as cloudfront
from aws_cdk import aws_cloudfront_origins as origins
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from functions.core import http, schema
from functions.core.settings import Settings
from functions.stream_front.__main__ import API_ORIGIN_ENV
from functions.stream_front.server import HEALTH_PATH, PORT, SOCKET_TIMEOUT_SECONDS
from infra import names
from infra.config import DeployConfig, StreamFrontConfig

from .common import (
    API_OWN_PARTITIONS,
    KEY_ITEMS,
    NOT_OWN_PARTITIONS,
    STORED_PARTITIONS,
    TENANT_POLICIES,
    acknowledge,
    acknowledge_wildcards,
    arn_in_findings,
    grant_items,
    log_group,
    removal_policy,
    vpc_without_nat,
)
from .storage import Storage
from .worker import REPO_ROOT, dockerignore_patterns

#: The image: built by CDK (at deploy, not at synth) from the repository root.
DOCKERFILE: Final = "functions/stream_front/Dockerfile"
DOCKERIGNORE: Final = REPO_ROOT / "functions" / "stream_front" / "Dockerfile.dockerignore"

#: The behaviours that go to the front (CloudFront path patterns: ``*`` matches any characters).
STREAMED_PATHS: Final = ("/v1/files", "/v1/files/*/content", "/v1/uploads/*/parts")
#: The load balancer's listener port (HTTP inside the VPC; see the module docstring).
LISTENER_PORT: Final = 80
#: CloudFront's keep-alive timeout to both origins (the most without a quota raise).
KEEPALIVE_TIMEOUT: Final = cdk.Duration.seconds(60)
#: The API Gateway origin answers within its 29 s integration timeout; a margin over it.
API_READ_TIMEOUT: Final = cdk.Duration.seconds(60)
#: The load balancer's idle timeout: above CloudFront's keep-alive (CloudFront closes idle
#: connections first) and below the server's socket timeout (the load balancer closes before it).
ALB_IDLE_TIMEOUT: Final = cdk.Duration.seconds(90)
#: How long a deregistered task keeps serving the requests it has (an upload in flight): 512 MB at
#: 14 Mbit/s. A task with none left stops at once.
DEREGISTRATION_DELAY: Final = cdk.Duration.seconds(300)
#: SIGTERM -> SIGKILL (Fargate's most is 120 s): the server stops taking connections at SIGTERM.
STOP_TIMEOUT: Final = cdk.Duration.seconds(60)
#: The CPU the service scales out at (target tracking), when max_tasks > min_tasks.
SCALE_CPU_PERCENT: Final = 60
#: The 4xx/5xx codes CloudFront caches by default (10 s), each set to never be cached.
ERROR_CODES: Final = (400, 403, 404, 405, 414, 416, 500, 501, 502, 503, 504)

#: ``com.amazonaws.global.cloudfront.origin-facing`` by region (its id differs per region; AWS
#: publishes no CloudFormation lookup). A region not here needs ``cloudfront_prefix_list_id``:
#: deploying there without it fails on this mapping, before anything is created.
ORIGIN_FACING_PREFIX_LISTS: Final = {
    "us-east-1": "pl-3b927c52",
    "us-east-2": "pl-b6a144df",
    "us-west-1": "pl-4ea04527",
    "us-west-2": "pl-82a045eb",
    "eu-west-1": "pl-4fa04526",
    "eu-west-2": "pl-93a247fa",
    "eu-central-1": "pl-a3a144ca",
    "ap-northeast-1": "pl-58a04531",
    "ap-southeast-1": "pl-31a34658",
    "ap-southeast-2": "pl-b8a742d1",
}

#: The partitions the front writes (PutItem, UpdateItem, DeleteItem; GetItem too): a tenant's own
#: partition (``T#<tenant>``: files, uploads, parts; ``T#*`` minus ``T#*#*``), its request counter
#: (``tenants.admit_request``) and its stored-bytes ledger (``check_storage``, a file's charge).
FRONT_WRITE_PARTITIONS: Final = (schema.requests_pk("*"), STORED_PARTITIONS)
FRONT_ITEM_ACTIONS: Final = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
#: The objects the front writes and reads: files (``files/<tenant>/<id>``) and Uploads parts.
FRONT_OBJECTS: Final = (schema.file_key("*", "*").removesuffix("/*/*") + "/*", schema.UPLOADS_PREFIX + "*")

assert schema.tenant_pk("*") == API_OWN_PARTITIONS  # the exclusion below relies on it
assert ALB_IDLE_TIMEOUT.to_seconds() < SOCKET_TIMEOUT_SECONDS


def front_image(front: StreamFrontConfig) -> ecs.ContainerImage:
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT),
        file=DOCKERFILE,
        platform=ecr_assets.Platform.LINUX_ARM64 if front.architecture == "arm64" else ecr_assets.Platform.LINUX_AMD64,
        exclude=dockerignore_patterns(DOCKERIGNORE),
        ignore_mode=cdk.IgnoreMode.DOCKER,
    )


def api_origin(rest_api: apigw.RestApi) -> str:
    """``https://<rest api id>.execute-api.<region>.<suffix>/<stage>``: what the front relays to."""
    return cdk.Fn.join(
        "",
        [
            "https://",
            rest_api.rest_api_id,
            ".execute-api.",
            cdk.Aws.REGION,
            ".",
            cdk.Aws.URL_SUFFIX,
            "/",
            names.API_STAGE,
        ],
    )


class StreamFront(Construct):
    """``vpc``, ``cluster``, ``service``, ``task_definition``, ``load_balancer``, ``distribution``
    and ``url`` (the ``base_url`` clients use, ending in ``/v1``)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage: Storage,
        settings: Settings,
        rest_api: apigw.RestApi,
    ) -> None:
        super().__init__(scope, id)
        front = config.stream_front
        assert front is not None, "the stack builds the streaming front only when config.stream_front is set"

        self._network(config, front)
        self._service(config, front, storage, settings, rest_api)
        self._load_balancer(storage)
        self._distribution(config, front, storage, rest_api)
        self._acknowledge(config, front, storage)

    # --- network ---------------------------------------------------------------------------------
    def _network(self, config: DeployConfig, front: StreamFrontConfig) -> None:
        zones = {"availability_zones": list(front.availability_zones)} if front.availability_zones else {"max_azs": 2}
        self.vpc = vpc_without_nat(
            self,
            config,
            cidr="10.65.0.0/16",
            **zones,
            subnets=[
                ec2.SubnetConfiguration(name="tasks", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="origin", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24),
            ],
        )
        self.alb_security_group = ec2.SecurityGroup(
            self,
            "LoadBalancerSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Streaming front load balancer: HTTP from the CloudFront VPC origin only",
        )
        self.alb_security_group.add_ingress_rule(
            ec2.Peer.prefix_list(self._origin_facing_prefix_list(front)),
            ec2.Port.tcp(LISTENER_PORT),
            "CloudFront origin-facing (VPC origin)",
        )
        self.task_security_group = ec2.SecurityGroup(
            self,
            "TaskSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Streaming front tasks: from the load balancer only; HTTPS out (AWS APIs, the API)",
        )
        self.task_security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs and the API"
        )

    def _origin_facing_prefix_list(self, front: StreamFrontConfig) -> str:
        if front.cloudfront_prefix_list_id is not None:
            return front.cloudfront_prefix_list_id
        mapping = cdk.CfnMapping(
            self,
            "OriginFacingPrefixLists",
            mapping={region: {"PrefixListId": pl} for region, pl in ORIGIN_FACING_PREFIX_LISTS.items()},
        )
        return mapping.find_in_map(cdk.Aws.REGION, "PrefixListId")

    # --- the service -------------------------------------------------------------------------------
    def _service(
        self,
        config: DeployConfig,
        front: StreamFrontConfig,
        storage: Storage,
        settings: Settings,
        rest_api: apigw.RestApi,
    ) -> None:
        # Container Insights off: the service's CPU and memory (AWS/ECS, free) drive the scaling,
        # the load balancer's metrics show its traffic (AwsSolutions-ECS4 acknowledged).
        self.cluster = ecs.Cluster(self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.DISABLED)
        arm = front.architecture == "arm64"
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=front.cpu,
            memory_limit_mib=front.memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64 if arm else ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        self.container = self.task_definition.add_container(
            "Front",
            image=front_image(front),
            environment={
                **settings.to_env(),
                API_ORIGIN_ENV: api_origin(rest_api),
                "AWS_REGION": cdk.Aws.REGION,
                "AWS_DEFAULT_REGION": cdk.Aws.REGION,
            },
            port_mappings=[ecs.PortMapping(container_port=PORT, protocol=ecs.Protocol.TCP)],
            logging=ecs.LogDrivers.aws_logs(stream_prefix="stream-front", log_group=log_group(self, "Logs", config)),
            readonly_root_filesystem=True,  # nothing is written locally: bytes go to S3 as they come
            stop_timeout=STOP_TIMEOUT,
            essential=True,
        )
        self._grant(storage)

        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            desired_count=front.min_tasks,
            assign_public_ip=True,  # egress without a NAT gateway (module docstring)
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            security_groups=[self.task_security_group],
            # A new task is healthy behind the load balancer before the old one drains.
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            health_check_grace_period=cdk.Duration.seconds(30),
            propagate_tags=ecs.PropagatedTagSource.SERVICE,
            enable_ecs_managed_tags=True,
        )
        if front.max_tasks > front.min_tasks:
            scaling = self.service.auto_scale_task_count(min_capacity=front.min_tasks, max_capacity=front.max_tasks)
            scaling.scale_on_cpu_utilization("Cpu", target_utilization_percent=SCALE_CPU_PERCENT)

    def _grant(self, storage: Storage) -> None:
        """The front's rights (module docstring): the API Lambda's, narrowed to what it touches."""
        role = self.task_definition.task_role
        grant_items(role, storage, ("dynamodb:GetItem",), (KEY_ITEMS, TENANT_POLICIES))
        grant_items(role, storage, FRONT_ITEM_ACTIONS, (API_OWN_PARTITIONS,), excluding=(NOT_OWN_PARTITIONS,))
        grant_items(role, storage, FRONT_ITEM_ACTIONS, FRONT_WRITE_PARTITIONS)
        for pattern in FRONT_OBJECTS:
            storage.bucket.grant_put(role, pattern)  # PutObject covers the multipart calls; Abort*
            storage.bucket.grant_delete(role, pattern)  # a failed or refused body leaves no object
        storage.bucket.grant_read(role, FRONT_OBJECTS[0])  # a file's content (uploads' parts are never read)
        # The audit intents: the stack grants sqs:SendMessage on the audit queue (Audit.grant_send).

    @property
    def task_role(self) -> iam.IRole:
        return self.task_definition.task_role

    # --- the load balancer -------------------------------------------------------------------------
    def _load_balancer(self, storage: Storage) -> None:
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self,
            "LoadBalancer",
            vpc=self.vpc,
            internet_facing=False,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
            security_group=self.alb_security_group,
            idle_timeout=ALB_IDLE_TIMEOUT,
            drop_invalid_header_fields=True,
        )
        self.listener = self.load_balancer.add_listener(
            "Http",
            port=LISTENER_PORT,
            protocol=elbv2.ApplicationProtocol.HTTP,
            open=False,
        )
        self.target_group = self.listener.add_targets(
            "Front",
            port=PORT,
            protocol=elbv2.ApplicationProtocol.HTTP,
            targets=[self.service],
            deregistration_delay=DEREGISTRATION_DELAY,
            # Long uploads and short requests mix: the next request goes to the task with fewest open.
            load_balancing_algorithm_type=elbv2.TargetGroupLoadBalancingAlgorithmType.LEAST_OUTSTANDING_REQUESTS,
            health_check=elbv2.HealthCheck(
                path=HEALTH_PATH,
                healthy_http_codes="200",
                interval=cdk.Duration.seconds(15),
                timeout=cdk.Duration.seconds(5),
                healthy_threshold_count=2,
                unhealthy_threshold_count=3,
            ),
        )

    # --- the distribution ------------------------------------------------------------------------
    def _distribution(
        self, config: DeployConfig, front: StreamFrontConfig, storage: Storage, rest_api: apigw.RestApi
    ) -> None:
        self.no_cache = cloudfront.CachePolicy(
            self,
            "NoCache",
            comment="Nothing cached; the bearer key in the key, so CloudFront forwards it on GET and HEAD",
            min_ttl=cdk.Duration.seconds(0),
            default_ttl=cdk.Duration.seconds(0),
            max_ttl=cdk.Duration.seconds(1),
            header_behavior=cloudfront.CacheHeaderBehavior.allow_list(http.AUTH_HEADER),
            query_string_behavior=cloudfront.CacheQueryStringBehavior.all(),
            cookie_behavior=cloudfront.CacheCookieBehavior.none(),
            enable_accept_encoding_gzip=False,
            enable_accept_encoding_brotli=False,
        )
        api = origins.RestApiOrigin(rest_api, read_timeout=API_READ_TIMEOUT, keepalive_timeout=KEEPALIVE_TIMEOUT)
        streamed = origins.VpcOrigin.with_application_load_balancer(
            self.load_balancer,
            protocol_policy=cloudfront.OriginProtocolPolicy.HTTP_ONLY,
            http_port=LISTENER_PORT,
            read_timeout=cdk.Duration.seconds(front.origin_read_timeout_seconds),
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )

        def behavior(origin: cloudfront.IOrigin) -> cloudfront.BehaviorOptions:
            return cloudfront.BehaviorOptions(
                origin=origin,
                allowed_methods=cloudfront.AllowedMethods.ALLOW_ALL,
                cached_methods=cloudfront.CachedMethods.CACHE_GET_HEAD,
                cache_policy=self.no_cache,
                origin_request_policy=cloudfront.OriginRequestPolicy.ALL_VIEWER_EXCEPT_HOST_HEADER,
                viewer_protocol_policy=cloudfront.ViewerProtocolPolicy.HTTPS_ONLY,
                compress=False,  # bytes as the origin sends them
            )

        self.log_bucket = s3.Bucket(
            self,
            "DistributionLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            # CloudFront's standard logs are written with an ACL grant (its log delivery account).
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            enforce_ssl=True,
            server_access_logs_bucket=storage.access_logs,
            server_access_logs_prefix="cloudfront-logs/",
            lifecycle_rules=[s3.LifecycleRule(id="expire-cloudfront-logs", expiration=cdk.Duration.days(365))],
            removal_policy=removal_policy(config),
            auto_delete_objects=config.removal_policy == "destroy",
        )
        domain = config.domain
        certificate = None
        if domain is not None and front.certificate_arn is not None:
            certificate = acm.Certificate.from_certificate_arn(self, "Certificate", front.certificate_arn)
        self.distribution = cloudfront.Distribution(
            self,
            "Distribution",
            comment="OpenAI-compatible Files and Batch API (streamed bodies to the front, the rest to API Gateway)",
            default_behavior=behavior(api),
            additional_behaviors={path: behavior(streamed) for path in STREAMED_PATHS},
            error_responses=[
                cloudfront.ErrorResponse(http_status=code, ttl=cdk.Duration.seconds(0)) for code in ERROR_CODES
            ],
            http_version=cloudfront.HttpVersion.HTTP2,
            enable_ipv6=True,
            price_class=cloudfront.PriceClass[front.price_class.upper().replace("PRICECLASS_", "PRICE_CLASS_")],
            domain_names=[domain.name] if certificate is not None and domain is not None else None,
            certificate=certificate,
            minimum_protocol_version=cloudfront.SecurityPolicyProtocol.TLS_V1_2_2021 if certificate else None,
            web_acl_id=front.web_acl_arn,
            enable_logging=True,
            log_bucket=self.log_bucket,
            log_file_prefix="distribution/",
        )
        host = (
            domain.name
            if certificate is not None and domain is not None
            else self.distribution.distribution_domain_name
        )
        self.url = f"https://{host}{http.API_PREFIX}"

    # --- cdk-nag ---------------------------------------------------------------------------------
    def _acknowledge(self, config: DeployConfig, front: StreamFrontConfig, storage: Storage) -> None:
        bucket = arn_in_findings(storage.bucket)
        acknowledge_wildcards(
            self.task_role,
            {
                f"Resource::{bucket}/{FRONT_OBJECTS[0]}": "Files are keyed per tenant and file id (files/<tenant>/<id>); the "
                "front streams every tenant's new files in, reads their content, deletes a refused one: files/ only.",
                f"Resource::{bucket}/{FRONT_OBJECTS[1]}": "Uploads parts are keyed per tenant, upload and part "
                "(uploads/<tenant>/<upload>/<part>); the front writes every tenant's parts, deletes a refused one.",
                "Action::s3:GetObject*": "grant_read's action group (GetObject, HeadObject, ranged reads), on files/ only.",
                "Action::s3:GetBucket*": "grant_read's bucket metadata actions, on this bucket only.",
                "Action::s3:List*": "grant_read's list actions, on this bucket only (a missing key answers 404, not 403).",
                "Action::s3:Abort*": "grant_put's action group: aborting a multipart upload whose body failed or was refused, "
                "on files/ and uploads/ only.",
                "Action::s3:DeleteObject*": "grant_delete's action group: removing a refused body's object, on files/ and "
                "uploads/ only.",
            },
        )
        acknowledge(
            self.task_definition.execution_role,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken (pulling the image asset) has no resource-level permissions.",
        )
        acknowledge(
            self.task_definition,
            "AwsSolutions-ECS2",
            "The environment is the deployment's non-secret settings (Settings.to_env(): names, queue URLs, limits) and "
            "the API's URL; the front has no secret.",
        )
        acknowledge(
            self.cluster,
            "AwsSolutions-ECS4",
            "Container Insights would bill custom metrics around the clock for one small service; its CPU and memory "
            "(AWS/ECS) and the load balancer's metrics and target health are free and drive the scaling.",
        )
        acknowledge(
            self.load_balancer,
            "AwsSolutions-ELB2",
            "The distribution's standard logs record every request it forwards to this internal load balancer (status, "
            "bytes, time taken); only CloudFront's VPC origin reaches it.",
        )
        if front.web_acl_arn is None:
            acknowledge(
                self.distribution,
                "AwsSolutions-CFR2",
                "A CloudFront (global) WAFv2 web ACL is a per-deployment choice (stream_front.web_acl_arn); without one "
                "the distribution is protected by bearer-key auth on every route and API Gateway's throttling.",
            )
        acknowledge(
            self.distribution,
            "AwsSolutions-CFR1",
            "An API for the deployment's tenants, who authenticate with bearer keys: no geographic restriction.",
        )
        if config.domain is None:
            acknowledge(
                self.distribution,
                "AwsSolutions-CFR4",
                "Without a custom domain the distribution uses CloudFront's *.cloudfront.net certificate, whose "
                "minimum protocol CloudFront fixes at TLSv1; with domain and stream_front.certificate_arn set it is "
                "TLS 1.2 (TLSv1.2_2021).",
            )
