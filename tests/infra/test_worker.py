"""The GPU workers: network, capacity (GPU AMI, launch template, ASG, capacity providers), the task
(image asset, GPU, cache, environment, draining), least privilege, and the scaling policies: the
alarms' metric math is evaluated here for the situations that matter (first message, backlog,
trickle, chunks in flight, empty queue)."""

import json
import math
import operator
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from infra.config import DeployConfig
from infra.constructs import worker as worker_construct

from .test_lambdas import expected_settings_env


def _by_model(synth, type_: str) -> dict[str, dict]:
    """model name -> properties of the one resource of ``type_`` under that model's construct."""
    out = {}
    for index, model in enumerate(synth.config.models):
        prefix = f"WorkersModel{index}"
        (props,) = [r["Properties"] for k, r in synth.resources(type_).items() if k.startswith(prefix)]
        out[model.name] = props
    return out


def _model(synth, name):
    return next(m for m in synth.config.models if m.name == name)


# --- network ------------------------------------------------------------------------------------
def test_default_network_has_no_nat_and_no_inbound(synth):
    assert not synth.resources("AWS::EC2::NatGateway")
    assert not synth.resources("AWS::EC2::EIP")
    _, sg = synth.one("AWS::EC2::SecurityGroup")
    assert "SecurityGroupIngress" not in sg["Properties"]
    assert not synth.resources("AWS::EC2::SecurityGroupIngress")
    subnets = synth.resources("AWS::EC2::Subnet").values()
    assert len(subnets) == 2 and all(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets)
    endpoints = {synth.render(e["Properties"]["ServiceName"]).rsplit(".", 1)[-1] for e in synth.resources("AWS::EC2::VPCEndpoint").values()}
    assert endpoints == {"s3", "dynamodb"}  # gateway endpoints: free
    _, flow = synth.one("AWS::EC2::FlowLog")
    assert flow["Properties"]["TrafficType"] == "ALL"


def test_an_existing_vpc_from_the_config():
    # A small stack of its own (no full synth): the network construct alone, given by ids.
    config = DeployConfig.model_validate({"network": {
        "vpc_id": "vpc-0123456789abcdef0", "subnet_ids": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
        "availability_zones": ["eu-west-1a", "eu-west-1b"], "public_ip": False,
    }})
    stack = cdk.Stack(cdk.App(), "NetworkOnly")
    network = worker_construct.WorkerNetwork(stack, "Network", config=config)
    template = Template.from_stack(stack).to_json()
    assert set(r["Type"] for r in template["Resources"].values()) == {"AWS::EC2::SecurityGroup"}
    assert network.public_ip is False
    assert [s.subnet_id for s in network.vpc.select_subnets(subnets=network.subnets.subnets).subnets] == list(config.network.subnet_ids)


# --- capacity -----------------------------------------------------------------------------------
def test_launch_templates_gpu_ami_imdsv2_encrypted_cache_volume(synth):
    templates = {k: r["Properties"]["LaunchTemplateData"] for k, r in synth.resources("AWS::EC2::LaunchTemplate").items()}
    assert len(templates) == sum(2 if m.spot else 1 for m in synth.config.models)
    ami = next(name for name in synth.json["Parameters"] if name.startswith("SsmParameterValue"))
    for index, model in enumerate(synth.config.models):
        for kind in ("OnDemand", "Spot") if model.spot else ("OnDemand",):
            (data,) = [d for k, d in templates.items() if k.startswith(f"WorkersModel{index}{kind}LaunchTemplate")]
            assert data["ImageId"] == {"Ref": ami}
            assert data["InstanceType"] == model.instance_type
            assert data["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
            (device,) = data["BlockDeviceMappings"]
            assert device == {"DeviceName": "/dev/xvda", "Ebs": {  # the ECS-optimized AMI's root device
                "DeleteOnTermination": True, "Encrypted": True, "VolumeSize": model.volume_gib, "VolumeType": "gp3",
            }}
            (nic,) = data["NetworkInterfaces"]
            assert nic["AssociatePublicIpAddress"] is True  # default network: public subnets, no NAT
            user_data = synth.render(data["UserData"]["Fn::Base64"])
            assert "ECS_CLUSTER=<WorkersModel" in user_data
            assert f"mkdir -p {worker_construct.CACHE_HOST_PATH}" in user_data
            spot = kind == "Spot"
            assert ("ECS_ENABLE_SPOT_INSTANCE_DRAINING=true" in user_data) == spot
            assert (data.get("InstanceMarketOptions", {}).get("MarketType") == "spot") == spot


def test_auto_scaling_groups_start_at_zero_protected_for_ecs(synth):
    assert not synth.resources("AWS::AutoScaling::LaunchConfiguration")
    groups = synth.resources("AWS::AutoScaling::AutoScalingGroup")
    assert len(groups) == sum(2 if m.spot else 1 for m in synth.config.models)
    for logical_id, group in groups.items():
        props = group["Properties"]
        index = int(logical_id.removeprefix("WorkersModel")[0])
        model = synth.config.models[index]
        assert props["MinSize"] == "0" and props["MaxSize"] == str(model.max_instances)
        assert "DesiredCapacity" not in props
        assert props["NewInstancesProtectedFromScaleIn"] is True
        assert "LaunchTemplate" in props
        assert props["MetricsCollection"] == [{"Granularity": "1Minute"}]


def test_capacity_providers_are_managed(synth):
    providers = synth.resources("AWS::ECS::CapacityProvider")
    assert len(providers) == sum(2 if m.spot else 1 for m in synth.config.models)
    for provider in providers.values():
        props = provider["Properties"]["AutoScalingGroupProvider"]
        assert props["ManagedScaling"] == {"Status": "ENABLED", "TargetCapacity": 100}
        assert props["ManagedTerminationProtection"] == "ENABLED"
        assert props["ManagedDraining"] == "ENABLED"


def test_clusters_have_container_insights(synth):
    clusters = synth.resources("AWS::ECS::Cluster")
    assert len(clusters) == len(synth.config.models)
    for cluster in clusters.values():
        assert {"Name": "containerInsights", "Value": "enabled"} in cluster["Properties"]["ClusterSettings"]


def test_services_start_at_min_and_place_spot_after_an_on_demand_base(synth):
    services = _by_model(synth, "AWS::ECS::Service")
    for name, props in services.items():
        model = _model(synth, name)
        assert props["DesiredCount"] == model.min_instances == 0
        deployment = props["DeploymentConfiguration"]
        assert (deployment["MinimumHealthyPercent"], deployment["MaximumPercent"]) == (0, 100)
        assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
        assert "LaunchType" not in props  # capacity providers place the tasks
        strategy = props["CapacityProviderStrategy"]
        if model.spot:
            on_demand, spot = strategy
            assert on_demand["Base"] == model.on_demand_base and on_demand["Weight"] == 1
            assert spot["Weight"] == model.spot_weight and "Base" not in spot
            assert "Spot" in spot["CapacityProvider"]["Ref"] and "OnDemand" in on_demand["CapacityProvider"]["Ref"]
        else:
            (on_demand,) = strategy
            assert on_demand == {"CapacityProvider": on_demand["CapacityProvider"], "Weight": 1}
            assert "OnDemand" in on_demand["CapacityProvider"]["Ref"]


# --- the task ------------------------------------------------------------------------------------
def test_task_runs_the_gpu_image_with_gpus_cache_and_draining(synth):
    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        model = _model(synth, name)
        assert props["RequiresCompatibilities"] == ["EC2"] and props["NetworkMode"] == "bridge"
        assert props["Volumes"] == [{"Name": "cache", "Host": {"SourcePath": worker_construct.CACHE_HOST_PATH}}]
        (container,) = props["ContainerDefinitions"]
        assert container["ResourceRequirements"] == [{"Type": "GPU", "Value": str(model.gpu_count)}]
        assert container["MountPoints"] == [{"ContainerPath": "/root/.cache", "SourceVolume": "cache", "ReadOnly": False}]
        assert container["LinuxParameters"]["SharedMemorySize"] == model.shared_memory_mib
        assert container["MemoryReservation"] == model.memory_reservation_mib
        assert container["Essential"] is True and "PortMappings" not in container
        assert container["LogConfiguration"]["LogDriver"] == "awslogs"


def test_stop_timeout_covers_the_worker_drain_and_the_engine_stop(synth):
    """ECS sends SIGKILL StopTimeout seconds after SIGTERM: the worker's drain (its WORKER_DRAIN_SECONDS,
    default 90 s per docs/worker.md; 60 s from the session config for embed-small) and then the
    engine's stop (ENGINE_STOP_SECONDS, read by the entrypoint) must both fit before it."""
    drains = {"org/Chat-Model-7B": 90, "embed-small": 60}  # docs/worker.md default; tests/infra/conftest.py
    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        (container,) = props["ContainerDefinitions"]
        env = {e["Name"]: synth.render(e["Value"]) for e in container["Environment"]}
        assert float(env.get("WORKER_DRAIN_SECONDS", 90)) == drains[name]  # what the worker will read
        engine_stop = int(env["ENGINE_STOP_SECONDS"])
        assert engine_stop > 0
        assert drains[name] + engine_stop < container["StopTimeout"] <= drains[name] + engine_stop + 30


def test_container_environment_is_the_settings_plus_the_worker_and_engine(synth):
    shared = expected_settings_env(synth)
    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        model = _model(synth, name)
        (container,) = props["ContainerDefinitions"]
        env = {e["Name"]: synth.render(e["Value"]) for e in container["Environment"]}
        assert {k: v for k, v in env.items() if k.startswith("BATCHAPI_")} == shared
        assert {k: v for k, v in env.items() if k.startswith("WORKER_")} == model.worker_env()
        assert env["WORKER_MODEL"] == model.name
        assert env["ENGINE_MODEL"] == (model.weights or model.name)
        assert env["ENGINE_SERVED_MODEL_NAME"] == model.name
        assert env["ENGINE_ARGS"].split() == list(model.engine_args)
        assert env["ENGINE_STOP_SECONDS"] == str(worker_construct.ENGINE_STOP_SECONDS)
        assert env["HF_HOME"].startswith(worker_construct.CACHE_CONTAINER_PATH + "/")
        assert env["AWS_REGION"] == "<AWS::Region>"
    chat = _by_model(synth, "AWS::ECS::TaskDefinition")["org/Chat-Model-7B"]["ContainerDefinitions"][0]
    assert chat["Secrets"] == [{"Name": "HF_TOKEN", "ValueFrom": _model(synth, "org/Chat-Model-7B").hf_token_secret_arn}]
    embed = _by_model(synth, "AWS::ECS::TaskDefinition")["embed-small"]["ContainerDefinitions"][0]
    assert "Secrets" not in embed


def test_image_asset_is_built_from_the_worker_dockerfile_with_only_what_it_copies(synth):
    manifest = json.loads((synth.outdir / f"{synth.stack.stack_name}.assets.json").read_text())
    images = manifest["dockerImages"]
    engine_images = {m.engine_image for m in synth.config.models}
    assert len(images) == len(engine_images)  # one image per distinct engine image
    for image in images.values():
        source = image["source"]
        assert source["dockerFile"] == worker_construct.DOCKERFILE
        assert source["dockerBuildArgs"]["VLLM_IMAGE"] in engine_images
        assert source["platform"] == "linux/amd64"
        staged = synth.outdir / source["directory"]
        files = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
        assert {worker_construct.DOCKERFILE, "gpu_worker/entrypoint.sh", "gpu_worker/__main__.py",
                "functions/core/settings.py", "functions/core/names.py", "pyproject.toml"} <= files
        assert not {f for f in files if f.startswith(("tests/", ".venv", "gpu_worker/engine/", "docs/"))}
        assert not {f for f in files if "__pycache__" in f or f.endswith(".pyc")}
        # The worker imports functions/ and itself only (tests/unit/test_imports.py): no infra/, no batchctl/.
        assert {f.split("/")[0] for f in files} <= {"functions", "gpu_worker", "pyproject.toml", "README.md"}


# --- least privilege ------------------------------------------------------------------------------
def _role_permissions(synth, role_id: str) -> set[tuple[str, str]]:
    return {(a, synth.render(json.loads(r))) for a, r in synth.permissions(role_id)}


def test_task_role_consumes_its_queue_reads_inputs_writes_parts_counts_and_signals(synth):
    bucket = synth.logical_id(synth.stack.storage.bucket)
    table = synth.one("AWS::DynamoDB::Table")[0]
    sm = synth.logical_id(synth.stack.workflow.state_machine)
    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        queue = synth.logical_id(synth.stack.ingest.work_queues[name])
        pairs = _role_permissions(synth, props["TaskRoleArn"]["Fn::GetAtt"][0])
        assert {a for a, r in pairs if a.startswith("sqs:")} == {
            "sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl",
        }
        assert {r for a, r in pairs if a.startswith("sqs:")} == {f"<{queue}.Arn>"}  # its own queue only
        s3 = {(a, r) for a, r in pairs if a.startswith("s3:")}
        assert {r for _, r in s3} == {f"<{bucket}.Arn>", f"<{bucket}.Arn>/batches/*/*/input.jsonl", f"<{bucket}.Arn>/batches/*/*/parts/*"}
        assert {a for a, r in s3 if r.endswith("/parts/*")} == {
            "s3:PutObject", "s3:PutObjectLegalHold", "s3:PutObjectRetention", "s3:PutObjectTagging",
            "s3:PutObjectVersionTagging", "s3:Abort*",
            "s3:GetObject*", "s3:GetBucket*", "s3:List*",  # a redelivered chunk reads its checkpoints
        }
        assert {a for a, r in s3 if r.endswith("input.jsonl")} == {"s3:GetObject*", "s3:GetBucket*", "s3:List*"}
        assert {r for a, r in pairs if a.startswith("dynamodb:")} == {f"<{table}.Arn>", f"<{table}.Arn>/index/*"}
        assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:SendTaskSuccess", f"<{sm}>")}
        assert {a.split(":")[0] for a, _ in pairs} == {"sqs", "s3", "dynamodb", "states"}  # metrics are EMF logs


def test_execution_role_pulls_the_image_writes_logs_reads_the_token(synth):
    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        pairs = _role_permissions(synth, props["ExecutionRoleArn"]["Fn::GetAtt"][0])
        services = {a.split(":")[0] for a, _ in pairs}
        model = _model(synth, name)
        assert services == ({"ecr", "logs", "secretsmanager"} if model.hf_token_secret_arn else {"ecr", "logs"})
        assert {r for a, r in pairs if a.startswith("secretsmanager:")} <= {model.hf_token_secret_arn}


def test_instances_can_only_run_the_ecs_agent(synth):
    roles = {
        k for k, r in synth.resources("AWS::IAM::Role").items()
        if k.startswith("WorkersModel") and "InstanceRole" in k
    }
    assert len(roles) == len(synth.config.models)
    for role in roles:
        services = {a.split(":")[0] for a, _ in _role_permissions(synth, role)}
        assert services <= {"ecs", "ecr", "logs"}, services


# --- scaling --------------------------------------------------------------------------------------
class _Num(float):
    """A metric value in metric math: division by zero is NaN (the IF around it picks the other branch)."""

    def __truediv__(self, other: float) -> "_Num":
        return _Num(math.nan) if other == 0 else _Num(float(self) / float(other))

    def __add__(self, other: float) -> "_Num":
        return _Num(float(self) + float(other))

    def __sub__(self, other: float) -> "_Num":
        return _Num(float(self) - float(other))

    def __mul__(self, other: float) -> "_Num":
        return _Num(float(self) * float(other))

    __rmul__ = __mul__


def evaluate(alarm: dict, values: dict[str, float | None]) -> float:
    """The value an alarm's metric math yields for the given raw metrics (by metric name;
    None = no datapoint)."""
    queries = {m["Id"]: m for m in alarm["Metrics"]}

    def value(query_id: str) -> Any:
        query = queries[query_id]
        if "MetricStat" in query:
            raw = values[query["MetricStat"]["Metric"]["MetricName"]]
            return None if raw is None else _Num(raw)
        expression = query["Expression"].replace(" AND ", " and ")
        scope = {ref: value(ref) for ref in queries if ref in expression}
        scope |= {"IF": lambda c, a, b: _Num(a) if c else _Num(b), "FILL": lambda m, v: _Num(v) if m is None else m}
        return eval(expression, {"__builtins__": {}}, scope)  # noqa: S307 - our own template's expressions

    (returned,) = [m for m in alarm["Metrics"] if m.get("ReturnData", True)]
    return float(value(returned["Id"]))


_COMPARE = {
    "GreaterThanOrEqualToThreshold": operator.ge,
    "LessThanOrEqualToThreshold": operator.le,
}


def _scaling(synth, name: str) -> tuple[dict, dict[str, tuple[dict, dict]]]:
    """The model's scalable target and its policies by name: (policy, alarm)."""
    index = [m.name for m in synth.config.models].index(name)
    prefix = f"WorkersModel{index}"
    (target_id,) = [k for k in synth.resources("AWS::ApplicationAutoScaling::ScalableTarget") if k.startswith(prefix)]
    target = synth.json["Resources"][target_id]["Properties"]
    policies = {}
    for policy_id, policy in synth.resources("AWS::ApplicationAutoScaling::ScalingPolicy").items():
        if policy["Properties"]["ScalingTargetId"] != {"Ref": target_id}:
            continue
        (alarm,) = [a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()
                    if a["Properties"].get("AlarmActions") == [{"Ref": policy_id}]]
        key = next(k for k in ("ScaleOut", "ScaleIn", "ScaleToMinimum") if f"TaskCountTarget{k}" in policy_id)
        policies[key] = (policy["Properties"], alarm)
    assert set(policies) == {"ScaleOut", "ScaleIn", "ScaleToMinimum"}
    return target, policies


def decide(synth, name: str, *, waiting: int, running: int, tasks: int | None) -> int:
    """The desired task count after every policy whose alarm breaches has acted once."""
    target, policies = _scaling(synth, name)
    values = {
        "ApproximateNumberOfMessagesVisible": waiting,
        "ApproximateNumberOfMessagesNotVisible": running,
        "DesiredTaskCount": tasks,
    }
    desired = tasks or 0
    for policy, alarm in policies.values():
        metric = evaluate(alarm, values)
        if not _COMPARE[alarm["ComparisonOperator"]](metric, alarm["Threshold"]):
            continue
        offset = metric - alarm["Threshold"]
        config = policy["StepScalingPolicyConfiguration"]
        assert config["AdjustmentType"] == "ChangeInCapacity"
        # Application Auto Scaling: above the threshold a step's lower bound is inclusive, below
        # it its upper bound is.
        above = alarm["ComparisonOperator"].startswith("GreaterThan")

        def contains(step: dict) -> bool:
            low, high = step.get("MetricIntervalLowerBound", -math.inf), step.get("MetricIntervalUpperBound", math.inf)
            return low <= offset < high if above else low < offset <= high

        (step,) = [s for s in config["StepAdjustments"] if contains(s)]
        desired += step["ScalingAdjustment"]
    return max(target["MinCapacity"], min(target["MaxCapacity"], desired))


@pytest.mark.parametrize("name", ["org/Chat-Model-7B", "embed-small"])
def test_scalable_target_from_min_to_max(synth, name):
    target, _ = _scaling(synth, name)
    model = _model(synth, name)
    assert (target["MinCapacity"], target["MaxCapacity"]) == (model.min_instances, model.max_instances) == (0, model.max_instances)
    assert target["ScalableDimension"] == "ecs:service:DesiredCount"


@pytest.mark.parametrize("name", ["org/Chat-Model-7B", "embed-small"])
def test_scaling_decisions(synth, name):
    t = _model(synth, name).backlog_per_task
    top = _model(synth, name).max_instances
    # The first message scales out from zero (Container Insights has a datapoint, or none at all).
    assert decide(synth, name, waiting=1, running=0, tasks=0) == 1
    assert decide(synth, name, waiting=1, running=0, tasks=None) == 1
    # A large backlog adds tasks fast, up to max_instances.
    assert decide(synth, name, waiting=10 * t, running=0, tasks=1) == min(top, 5)
    assert decide(synth, name, waiting=3 * t, running=0, tasks=2) == min(top, 3)
    # Within the target: nothing changes.
    assert decide(synth, name, waiting=t - 1, running=0, tasks=1) == 1
    assert decide(synth, name, waiting=t - 1, running=t, tasks=2) == 2
    assert decide(synth, name, waiting=t, running=t, tasks=2) == min(top, 3)  # T per task: one more
    # Chunks in flight keep the last task: running work is backlog.
    assert decide(synth, name, waiting=0, running=3, tasks=1) == 1
    # A trickle for many tasks: one fewer at a time (never below what the backlog needs).
    assert decide(synth, name, waiting=1, running=2, tasks=3) == 2
    assert decide(synth, name, waiting=0, running=t, tasks=2) == 2  # one task fewer would hold T: keep
    # An empty queue (waiting and in flight): down to min_instances (0).
    assert decide(synth, name, waiting=0, running=0, tasks=2) == 0
    assert decide(synth, name, waiting=0, running=0, tasks=0) == 0


@pytest.mark.parametrize("name", ["org/Chat-Model-7B", "embed-small"])
def test_scale_out_is_fast_scale_in_waits_idle_minutes(synth, name):
    _, policies = _scaling(synth, name)
    model = _model(synth, name)
    out_policy, out_alarm = policies["ScaleOut"]
    assert out_alarm["EvaluationPeriods"] == 1 and out_alarm["Threshold"] == model.backlog_per_task
    assert out_policy["StepScalingPolicyConfiguration"]["Cooldown"] == worker_construct.SCALE_OUT_COOLDOWN.to_seconds()
    for key in ("ScaleIn", "ScaleToMinimum"):
        policy, alarm = policies[key]
        assert alarm["EvaluationPeriods"] == model.idle_minutes
        assert policy["StepScalingPolicyConfiguration"]["Cooldown"] == worker_construct.SCALE_IN_COOLDOWN.to_seconds()
    for _, alarm in policies.values():
        for query in alarm["Metrics"]:
            if "MetricStat" in query:
                assert query["MetricStat"]["Period"] == 60


def test_scaling_reads_the_models_own_queue_and_service(synth):
    services = synth.resources("AWS::ECS::Service")
    for index, model in enumerate(synth.config.models):
        queue = synth.logical_id(synth.stack.ingest.work_queues[model.name])
        (service,) = [k for k in services if k.startswith(f"WorkersModel{index}")]
        _, policies = _scaling(synth, model.name)
        for _, alarm in policies.values():
            for query in alarm["Metrics"]:
                if "MetricStat" not in query:
                    continue
                metric = query["MetricStat"]["Metric"]
                dims = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
                if metric["Namespace"] == "AWS/SQS":
                    assert dims == {"QueueName": {"Fn::GetAtt": [queue, "QueueName"]}}
                else:
                    assert metric["Namespace"] == "ECS/ContainerInsights"  # AWS's Container Insights namespace
                    assert dims["ServiceName"] == {"Fn::GetAtt": [service, "Name"]}
