"""The GPU workers: per served model, an ECS service on EC2 GPU capacity that drains the model's work
queue with vLLM's OpenAI server and our worker in one task (``gpu_worker/Dockerfile``).

Per model: an ECS cluster (Container Insights on, for the dashboard) with one On-Demand capacity
provider, plus a Spot one when the model asks for Spot; each provider is an Auto Scaling group of
GPU instances (ECS-optimized GPU AMI, Amazon Linux 2023) that ECS scales with the tasks (managed
scaling, managed termination protection, managed draining), min 0. The service idles at zero
tasks and zero instances.

Scaling (``Scaler``, ``functions/scaler``): one small Lambda sets every model's desired task count
from its work queue (SQS GetQueueAttributes: visible and in-flight messages, numbers that exist at
zero tasks) and the service's own counts (ECS DescribeServices), with the rule in
``functions/scaler/logic.py``: scale out at once to ``floor(backlog / T) + 1`` tasks (at most
``max_instances``), scale in one task at a time with hysteresis and a cooldown, and to
``min_instances`` once the queue has been empty for ``idle_minutes``. It runs when a batch's
workflow starts (the Step Functions "Execution Status Change" event RUNNING, sent right after
ingest has enqueued the batch's chunks: no alarm period in the way) and every minute. There is no
Application Auto Scaling on the service: one controller owns the desired count.

In-flight messages count as backlog, so a task is not removed while its chunks run; a task that
is stopped anyway (scale-in, Spot interruption) gets SIGTERM and drains (``stop_timeout``).

The task role reaches only what the worker uses: the model's queue, batch inputs (read) and chunk
parts (read, write) in S3, and in the table, through GetItem/PutItem/UpdateItem only, the items of
two partition shapes (``dynamodb:LeadingKeys``): a tenant's batch partition ``T#<tenant>#BATCHES``
and a batch's chunk partition ``T#<tenant>#B#<batch>`` (``WORKER_LEADING_KEYS``). Never a tenant's
own partition ``T#<tenant>`` (file and upload records), its webhook records, an API key's item (``KEY#...``),
the scaler's state (``SCALER#...``) or an idempotency record; never a scan, a query, a delete or
an index. Besides: GetItem on the token budget items (``T#*#BUDGET``: a ``stop`` budget is
watched), never a write of them (the audit appender charges a counted chunk, from its marker,
with its receipt); with governance on, the stack grants it ``sqs:SendMessage`` on the audit queue
(a counted chunk's receipt) and no audit item.
"""

from collections.abc import Mapping
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions.core import schema
from functions.core.settings import Settings
from infra.config import DeployConfig, ModelConfig, NetworkConfig

from .common import (
    BATCH_PARTITIONS,
    CHUNK_PARTITIONS,
    acknowledge,
    acknowledge_wildcards,
    arn_in_findings,
    dead_letter_queue,
    grant_items,
    grant_watch,
    log_group,
    vpc_without_nat,
)
from .ingest import CHUNK_COUNT_ACTIONS, INPUT_KEYS, PART_KEYS
from .lambdas import Lambdas
from .storage import Storage
from .workflow import Workflow

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The GPU image: built by CDK (at deploy, not at synth) from the repository root.
DOCKERFILE = "gpu_worker/Dockerfile"
#: The Dockerfile's ignore file; its patterns are the asset's excludes (only what the image copies).
DOCKERIGNORE = REPO_ROOT / "gpu_worker" / "Dockerfile.dockerignore"

#: The instance volume folder bind-mounted at the container's cache (Hugging Face weights, vLLM
#: compile cache): a restarted task on the same instance does not download the weights again.
CACHE_HOST_PATH = "/var/lib/batch-worker/cache"
CACHE_CONTAINER_PATH = "/root/.cache"
#: The AMI's root device (the ECS-optimized Amazon Linux 2023 GPU AMI).
ROOT_DEVICE = "/dev/xvda"
#: How long the entrypoint lets the engine stop after the worker has drained (ENGINE_STOP_SECONDS).
ENGINE_STOP_SECONDS = 20
#: Slack between the worker's drain plus the engine's stop and ECS's SIGKILL.
STOP_SLACK_SECONDS = 10

SCALE_PERIOD = cdk.Duration.minutes(1)
#: The scaler removes at most one task per this period (scale-out has no cooldown: its target is
#: absolute, so running it again changes nothing).
SCALE_IN_COOLDOWN = cdk.Duration.minutes(5)
#: How often the scaler runs besides the workflow-start event (EventBridge's finest rate).
SCALER_RATE = cdk.Duration.minutes(1)
#: Attempts EventBridge makes to invoke the scaler for one event before it goes to the DLQ (a
#: missed tick is harmless: the next one, a minute later, reads the same queue).
SCALER_RETRIES = 2
#: Container Insights (ECS) namespace: the service's task counts (dashboard only).
ECS_INSIGHTS = "ECS/ContainerInsights"
#: The Step Functions event that starts a batch's scale-out: its workflow's execution RUNNING,
#: which ingest starts right after sending the batch's work messages (functions/ingest/logic.py).
EXECUTION_STATUS_CHANGE = "Step Functions Execution Status Change"

#: The DynamoDB actions the worker uses: GetItem, and PutItem and UpdateItem (also inside
#: TransactWriteItems, which IAM authorizes item by item with these actions, as CDK's own
#: ``grant_read_write_data`` relies on), BatchGetItem on chunk partitions only (a chunk's marker
#: and run record at its start) and ConditionCheckItem (an attempt opens only while its batch takes
#: chunks). No Query, Scan, DeleteItem, batch writes or index access.
WORKER_TABLE_ACTIONS = (*CHUNK_COUNT_ACTIONS, "dynamodb:ConditionCheckItem")
#: The partition keys the worker may touch (IAM ``StringLike`` patterns, built by the same
#: ``schema`` functions as the keys): a tenant's batch partition (``T#*#BATCHES``: the batch item
#: it starts and counts on) and a batch's chunk partition (``T#*#B#*``: count markers and run
#: records). A tenant name has no ``#`` (``records.TENANT_PATTERN``), so no other partition matches:
#: not ``T#<tenant>`` (files, uploads), ``T#<tenant>#WEBHOOKS``, ``KEY#``, ``SCALER#``, ``IDEMPOTENCY#``.
WORKER_LEADING_KEYS = (BATCH_PARTITIONS, CHUNK_PARTITIONS)


def dockerignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def worker_image(model: ModelConfig) -> ecs.ContainerImage:
    """The engine + worker image for ``model`` (one asset per distinct engine image)."""
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT),
        file=DOCKERFILE,
        build_args={"VLLM_IMAGE": model.engine_image},
        platform=ecr_assets.Platform.LINUX_AMD64,  # NVIDIA GPU instances are x86_64
        exclude=dockerignore_patterns(),
        ignore_mode=cdk.IgnoreMode.DOCKER,
    )


def stop_timeout(model: ModelConfig) -> cdk.Duration:
    """Long enough for the worker to finish (or release) its chunks and the engine to stop."""
    return cdk.Duration.seconds(int(model.worker_config().drain_seconds) + ENGINE_STOP_SECONDS + STOP_SLACK_SECONDS)


def container_environment(model: ModelConfig, settings: Settings) -> dict[str, str]:
    """The task's environment: the deployment's settings (exactly what the Lambdas read), the
    worker's own ``WORKER_*`` knobs, and the entrypoint's ``ENGINE_*`` variables."""
    return {
        **settings.to_env(),
        **model.worker_env(),
        "ENGINE_MODEL": model.weights or model.name,
        "ENGINE_SERVED_MODEL_NAME": model.name,
        "ENGINE_ARGS": " ".join(model.engine_args),
        "ENGINE_STOP_SECONDS": str(ENGINE_STOP_SECONDS),
        "HF_HOME": f"{CACHE_CONTAINER_PATH}/huggingface",
        "AWS_REGION": cdk.Aws.REGION,
        "AWS_DEFAULT_REGION": cdk.Aws.REGION,
    }


class WorkerNetwork(Construct):
    """Where the GPU instances run. Default: a new VPC with public subnets in two zones and no NAT
    gateway (nothing that bills while idle), S3 and DynamoDB gateway endpoints, flow logs; instances
    get public IPs for egress and accept no inbound traffic. Or an existing VPC from the config."""

    def __init__(self, scope: Construct, id: str, *, config: DeployConfig) -> None:
        super().__init__(scope, id)
        network: NetworkConfig | None = config.network
        if network is None:
            self.vpc: ec2.IVpc = vpc_without_nat(
                self,
                config,
                cidr="10.64.0.0/16",
                max_azs=2,
                subnets=[ec2.SubnetConfiguration(name="gpu", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=20)],
            )
            self.subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC)
            self.public_ip = True
        else:
            self.vpc = ec2.Vpc.from_vpc_attributes(
                self, "Vpc", vpc_id=network.vpc_id, availability_zones=list(network.availability_zones)
            )
            self.subnets = ec2.SubnetSelection(
                subnets=[
                    ec2.Subnet.from_subnet_attributes(self, f"Subnet{i}", subnet_id=subnet, availability_zone=zone)
                    for i, (subnet, zone) in enumerate(zip(network.subnet_ids, network.availability_zones, strict=True))
                ]
            )
            self.public_ip = network.public_ip
        self.security_group = ec2.SecurityGroup(
            self,
            "InstanceSecurityGroup",
            vpc=self.vpc,
            description="GPU worker instances: no inbound; outbound to ECR, AWS APIs and model weights",
            allow_all_outbound=True,
        )


class ModelWorker(Construct):
    """One model's GPU service: ``cluster``, ``service``, ``task_definition``, ``capacity_providers``
    (name -> provider), ``scaling``, and the metrics the scaling uses (``backlog``,
    ``backlog_per_task``, ``desired_tasks``)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        model: ModelConfig,
        settings: Settings,
        network: WorkerNetwork,
        storage: Storage,
        work_queue: sqs.IQueue,
        workflow: Workflow,
    ) -> None:
        super().__init__(scope, id)
        self.model = model
        self.work_queue = work_queue

        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=network.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        self.instance_role = iam.Role(self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        self.capacity_providers: dict[str, ecs.AsgCapacityProvider] = {}
        self.auto_scaling_groups: dict[str, autoscaling.AutoScalingGroup] = {}
        for kind in ("OnDemand", "Spot") if model.spot else ("OnDemand",):
            self._capacity(kind, model, network)

        # --- the task: engine + worker in one container -----------------------------------------
        self.task_definition = ecs.Ec2TaskDefinition(
            self,
            "Task",
            network_mode=ecs.NetworkMode.BRIDGE,  # egress through the host; nothing listens outside
            volumes=[ecs.Volume(name="cache", host=ecs.Host(source_path=CACHE_HOST_PATH))],
        )
        # The tenants' prefix-cache salts are HMACs under this secret (gpu_worker/shaping.py): the
        # container gets it, the engine beside the worker never does (gpu_worker/entrypoint.sh).
        self.cache_salt_secret = secretsmanager.Secret(
            self,
            "CacheSaltSecret",
            description=f"Prefix-cache salt key of the {model.name} workers",
            generate_secret_string=secretsmanager.SecretStringGenerator(password_length=64, exclude_punctuation=True),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        acknowledge(
            self.cache_salt_secret,
            "AwsSolutions-SMG4",
            "The cache-salt key protects no data: a rotation only makes every tenant's cached prefixes miss "
            "once; the engine's cache is lost on every task restart anyway.",
        )
        secrets = {"WORKER_CACHE_SALT_SECRET": ecs.Secret.from_secrets_manager(self.cache_salt_secret)}
        if model.hf_token_secret_arn:
            token = secretsmanager.Secret.from_secret_complete_arn(self, "HfToken", model.hf_token_secret_arn)
            secrets["HF_TOKEN"] = ecs.Secret.from_secrets_manager(token)
        self.container = self.task_definition.add_container(
            "EngineAndWorker",
            image=worker_image(model),
            gpu_count=model.gpu_count,
            memory_reservation_mib=model.memory_reservation_mib,
            environment=container_environment(model, settings),
            secrets=secrets,
            linux_parameters=ecs.LinuxParameters(self, "Linux", shared_memory_size=model.shared_memory_mib),
            logging=ecs.LogDrivers.aws_logs(stream_prefix="worker", log_group=log_group(self, "Logs", config)),
            stop_timeout=stop_timeout(model),
            essential=True,
        )
        self.container.add_mount_points(
            ecs.MountPoint(container_path=CACHE_CONTAINER_PATH, source_volume="cache", read_only=False)
        )
        self._grant(storage, workflow, settings)

        strategies = [
            ecs.CapacityProviderStrategy(
                capacity_provider=self.capacity_providers["OnDemand"].capacity_provider_name,
                base=model.on_demand_base if model.spot else None,
                weight=1,
            )
        ]
        if model.spot:
            strategies.append(
                ecs.CapacityProviderStrategy(
                    capacity_provider=self.capacity_providers["Spot"].capacity_provider_name, weight=model.spot_weight
                )
            )
        self.service = ecs.Ec2Service(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            desired_count=model.min_instances,  # explicit: CloudFormation's default would start a GPU
            capacity_provider_strategies=strategies,
            # One engine per GPU and no spare capacity: replace tasks stop-then-start (their chunks
            # go back to the queue) instead of needing an extra GPU instance during a deployment.
            min_healthy_percent=0,
            max_healthy_percent=100,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            propagate_tags=ecs.PropagatedTagSource.SERVICE,
            enable_ecs_managed_tags=True,
        )
        self._scaling(model)
        self._acknowledge(storage)

    # --- capacity ---------------------------------------------------------------------------------
    def _capacity(self, kind: str, model: ModelConfig, network: WorkerNetwork) -> None:
        spot = kind == "Spot"
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(
            # The image is large (vLLM + CUDA): reuse it when a task restarts on the same instance.
            "echo ECS_IMAGE_PULL_BEHAVIOR=prefer-cached >> /etc/ecs/ecs.config",
            f"mkdir -p {CACHE_HOST_PATH}",
        )
        if spot:
            # The interruption notice puts the instance in DRAINING: its task gets SIGTERM and
            # drains. (CDK adds this line only for the legacy spotPrice, not launch templates.)
            user_data.add_commands("echo ECS_ENABLE_SPOT_INSTANCE_DRAINING=true >> /etc/ecs/ecs.config")
        template = ec2.LaunchTemplate(
            self,
            f"{kind}LaunchTemplate",
            machine_image=ecs.EcsOptimizedImage.amazon_linux2023(ecs.AmiHardwareType.GPU),
            instance_type=ec2.InstanceType(model.instance_type),
            role=self.instance_role,
            user_data=user_data,
            security_group=network.security_group,
            associate_public_ip_address=network.public_ip,
            require_imdsv2=True,
            http_put_response_hop_limit=1,  # containers (bridge network) cannot reach the metadata service
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        model.volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
            spot_options=ec2.LaunchTemplateSpotOptions(interruption_behavior=ec2.SpotInstanceInterruption.TERMINATE)
            if spot
            else None,
        )
        group = autoscaling.AutoScalingGroup(
            self,
            f"{kind}Instances",
            vpc=network.vpc,
            vpc_subnets=network.subnets,
            launch_template=template,
            min_capacity=0,
            max_capacity=model.max_instances,
            new_instances_protected_from_scale_in=True,  # managed termination protection needs it
            group_metrics=[autoscaling.GroupMetrics.all()],
        )
        provider = ecs.AsgCapacityProvider(
            self,
            f"{kind}Capacity",
            auto_scaling_group=group,
            enable_managed_scaling=True,
            enable_managed_termination_protection=True,
            enable_managed_draining=True,
            target_capacity_percent=100,
            machine_image_type=ecs.MachineImageType.AMAZON_LINUX_2,  # AL2 and AL2023 bootstrap alike
        )
        self.cluster.add_asg_capacity_provider(provider)
        self.capacity_providers[kind] = provider
        self.auto_scaling_groups[kind] = group

    # --- least privilege for the task ----------------------------------------------------------
    def _grant(self, storage: Storage, workflow: Workflow, settings: Settings) -> None:
        role = self.task_definition.task_role
        self.work_queue.grant_consume_messages(role)  # receive, change visibility, delete
        storage.bucket.grant_read(role, INPUT_KEYS)  # ranged GET of a chunk's lines
        storage.bucket.grant_put(role, PART_KEYS)  # the chunk's output and error parts
        storage.bucket.grant_read(role, PART_KEYS)  # a redelivered chunk reads its checkpoints
        # Chunk accounting; ConditionCheckItem: an attempt opens only while its batch (or its
        # counting shard) takes chunks, a check on that item in the run record's transaction.
        grant_items(role, storage, WORKER_TABLE_ACTIONS, WORKER_LEADING_KEYS)
        # A chunk's marker and run record, read together as it starts (one BatchGetItem).
        grant_items(role, storage, ("dynamodb:BatchGetItem",), (CHUNK_PARTITIONS,))
        # A `stop` budget is read (T#*#BUDGET); the appender charges it, not this role.
        grant_watch(role, storage)
        workflow.grant_signal(role)  # the worker that counts the last chunk resumes the workflow
        # Metrics are CloudWatch EMF lines on stdout (the awslogs driver ships them): no
        # cloudwatch:PutMetricData needed.

    # --- scaling ---------------------------------------------------------------------------------
    def _scaling(self, model: ModelConfig) -> None:
        """The metrics the dashboard shows beside the scaler's decisions (the scaler itself reads
        the queue and the service through their APIs, not these series)."""
        t = model.backlog_per_task
        visible = self.work_queue.metric_approximate_number_of_messages_visible(
            period=SCALE_PERIOD, statistic="Maximum"
        )
        in_flight = self.work_queue.metric_approximate_number_of_messages_not_visible(
            period=SCALE_PERIOD, statistic="Maximum"
        )
        self.desired_tasks = self.task_count_metric("DesiredTaskCount")
        self.backlog = cw.MathExpression(
            expression="FILL(visible, 0) + FILL(inflight, 0)",
            using_metrics={"visible": visible, "inflight": in_flight},
            period=SCALE_PERIOD,
            label="Backlog (chunks waiting or running)",
        )
        tasks = cw.MathExpression(
            expression="FILL(desired, 0)", using_metrics={"desired": self.desired_tasks}, period=SCALE_PERIOD
        )
        self.backlog_per_task = cw.MathExpression(
            expression=f"IF(tasks > 0, backlog / tasks, IF(backlog > 0, {t}, 0))",
            using_metrics={"backlog": self.backlog, "tasks": tasks},
            period=SCALE_PERIOD,
            label="Backlog per task",
        )

    def scaled_service(self) -> dict:
        """What the scaler needs to scale this model: the fields of
        ``functions.scaler.logic.ScaledService`` (names and ARNs are deploy-time tokens)."""
        model = self.model
        return {
            "model": model.name,
            "cluster": self.cluster.cluster_name,
            "service": self.service.service_name,
            "queue_url": self.work_queue.queue_url,
            "min_tasks": model.min_instances,
            "max_tasks": model.max_instances,
            "backlog_per_task": model.backlog_per_task,
            "idle_seconds": model.idle_minutes * 60,
            "scale_in_cooldown_seconds": int(SCALE_IN_COOLDOWN.to_seconds()),
        }

    def task_count_metric(self, name: str) -> cw.Metric:
        """A Container Insights task count of the service (DesiredTaskCount, RunningTaskCount, ...)."""
        return cw.Metric(
            namespace=ECS_INSIGHTS,
            metric_name=name,
            dimensions_map={"ClusterName": self.cluster.cluster_name, "ServiceName": self.service.service_name},
            period=SCALE_PERIOD,
            statistic="Maximum",
        )

    # --- cdk-nag ---------------------------------------------------------------------------------
    def _acknowledge(self, storage: Storage) -> None:
        bucket = arn_in_findings(storage.bucket)
        acknowledge_wildcards(
            self.task_definition.task_role,
            {
                f"Resource::{bucket}/{INPUT_KEYS}": "The worker reads its chunk's lines (one ranged GET of any tenant's "
                "batch input snapshot); input snapshots only.",
                f"Resource::{bucket}/{PART_KEYS}": "The worker writes its chunk's output and error parts and reads its "
                "checkpoints (keys per attempt under the batch's parts/).",
                "Action::s3:GetObject*": "grant_read's action group (GetObject, HeadObject, ranged reads), on the key "
                "patterns granted only.",
                "Action::s3:GetBucket*": "grant_read's bucket metadata actions, on this bucket only.",
                "Action::s3:List*": "grant_read's list actions, on this bucket only (a missing key answers 404, not 403).",
                "Action::s3:Abort*": "grant_put's action group: aborting a failed multipart write, on the key patterns "
                "granted only.",
            },
        )
        acknowledge(
            self.task_definition.execution_role,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken (pulling the image asset) has no resource-level permissions.",
        )
        acknowledge_wildcards(
            self.instance_role,
            {
                "Resource::*": "The ECS container agent's permissions CDK grants a capacity provider's instances "
                "(DiscoverPollEndpoint, Poll, StartTelemetrySession, ecr:GetAuthorizationToken, logs...): these have no "
                "resource-level permissions; cluster-scoped ones are scoped to this cluster.",
                "Action::ecs:Submit*": "The ECS container agent reports task, container and attachment state changes "
                "(SubmitTaskStateChange, SubmitContainerStateChange, SubmitAttachmentStateChanges), on this cluster.",
            },
        )
        acknowledge(
            self.task_definition,
            "AwsSolutions-ECS2",
            "The environment is the deployment's non-secret settings (Settings.to_env(): names, queue URLs, limits) and "
            "the engine's arguments; the only secret (a Hugging Face token) comes from Secrets Manager.",
        )
        for group in self.auto_scaling_groups.values():
            acknowledge(
                group,
                "AwsSolutions-AS3",
                "ECS managed scaling drives this group (capacity provider); scaling shows on the dashboard (in-service "
                "instances, desired and running tasks) and failed tasks on the service's events.",
            )


class Scaler(Construct):
    """``function`` (functions/scaler), run by ``on_start`` (a batch's workflow execution RUNNING,
    right after its chunks were enqueued) and ``schedule`` (every minute); ``dead_letters`` holds
    invocations EventBridge could not deliver. Its rights: read the queues' depth, read and set the
    desired count of the models' services, and its own state items (``SCALER#<model>``)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        storage: Storage,
        lambdas: Lambdas,
        workflow: Workflow,
        workers: Mapping[str, ModelWorker],
    ) -> None:
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        services = [w.scaled_service() for w in workers.values()]
        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.scaler.handler.handler",
            environment={
                "SCALER_TABLE_NAME": storage.table.table_name,
                "SCALER_SERVICES": stack.to_json_string(services),
            },
            description="Sets the GPU services' desired task counts from their work queues (functions/scaler)",
            memory_size=256,
            timeout=cdk.Duration.seconds(30),
        )
        # No reserved concurrency (a new account's limit of 10 leaves none to reserve): two runs at
        # once read the same queue and set the same absolute count; the state item is last-writer-wins.
        for worker in workers.values():
            worker.work_queue.grant(self.function, "sqs:GetQueueAttributes")
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:DescribeServices", "ecs:UpdateService"],
                resources=[w.service.service_arn for w in workers.values()],
            )
        )
        grant_items(self.function, storage, ("dynamodb:GetItem", "dynamodb:PutItem"), (schema.scaler_pk("*"),))

        self.dead_letters = dead_letter_queue(
            self, "DeadLetters", of="scaler invocations EventBridge could not deliver"
        )

        def target() -> targets.LambdaFunction:
            return targets.LambdaFunction(
                self.function,
                retry_attempts=SCALER_RETRIES,
                dead_letter_queue=self.dead_letters,
                max_event_age=SCALER_RATE,
            )

        self.schedule = events.Rule(
            self,
            "Schedule",
            description="Runs the GPU scaler every minute",
            schedule=events.Schedule.rate(SCALER_RATE),
            targets=[target()],
        )
        # Step Functions sends its executions' status changes to the default bus (best effort:
        # the schedule is the backstop).
        self.on_start = events.Rule(
            self,
            "OnBatchStart",
            description="Runs the GPU scaler when a batch's workflow starts (its chunks were just enqueued)",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=[EXECUTION_STATUS_CHANGE],
                detail={"status": ["RUNNING"], "stateMachineArn": [workflow.state_machine.state_machine_arn]},
            ),
            targets=[target()],
        )


class Workers(Construct):
    """The network, one ``ModelWorker`` per served model (``workers`` by model name) and the
    ``scaler`` of their services."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        settings: Settings,
        storage: Storage,
        work_queues: Mapping[str, sqs.IQueue],
        workflow: Workflow,
        lambdas: Lambdas,
    ) -> None:
        super().__init__(scope, id)
        self.network = WorkerNetwork(self, "Network", config=config)
        self.workers: dict[str, ModelWorker] = {
            model.name: ModelWorker(
                self,
                f"Model{index}",
                config=config,
                model=model,
                settings=settings,
                network=self.network,
                storage=storage,
                work_queue=work_queues[model.name],
                workflow=workflow,
            )
            for index, model in enumerate(config.models)
        }
        self.scaler = Scaler(self, "Scaler", storage=storage, lambdas=lambdas, workflow=workflow, workers=self.workers)
