"""The GPU workers: network, capacity (GPU AMI, launch template, ASG, capacity providers), the task
(image asset, GPU, cache, environment, draining), least privilege (the table by partition key:
never an API key's item), and no Application Auto Scaling (the scaler owns the desired count:
tests/infra/test_scaler.py)."""

import fnmatch
import json

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


def _workers(synth, type_: str) -> dict[str, dict]:
    """The resources of ``type_`` of the GPU workers (not the streaming front's VPC, cluster and
    service: tests/infra/test_stream_front.py)."""
    return {k: r for k, r in synth.resources(type_).items() if k.startswith("Workers")}


def _model(synth, name):
    return next(m for m in synth.config.models if m.name == name)


# --- network ------------------------------------------------------------------------------------
def test_default_network_has_no_nat_and_no_inbound(synth):
    assert not synth.resources("AWS::EC2::NatGateway")  # the whole stack's: none
    assert not synth.resources("AWS::EC2::EIP")
    (sg,) = _workers(synth, "AWS::EC2::SecurityGroup").values()
    assert "SecurityGroupIngress" not in sg["Properties"]
    assert not _workers(synth, "AWS::EC2::SecurityGroupIngress")
    subnets = _workers(synth, "AWS::EC2::Subnet").values()
    assert len(subnets) == 2 and all(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets)
    endpoints = {
        synth.render(e["Properties"]["ServiceName"]).rsplit(".", 1)[-1]
        for e in _workers(synth, "AWS::EC2::VPCEndpoint").values()
    }
    assert endpoints == {"s3", "dynamodb"}  # gateway endpoints: free
    (flow,) = _workers(synth, "AWS::EC2::FlowLog").values()
    assert flow["Properties"]["TrafficType"] == "ALL"


def test_an_existing_vpc_from_the_config():
    # A small stack of its own (no full synth): the network construct alone, given by ids.
    config = DeployConfig.model_validate(
        {
            "network": {
                "vpc_id": "vpc-0123456789abcdef0",
                "subnet_ids": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
                "availability_zones": ["eu-west-1a", "eu-west-1b"],
                "public_ip": False,
            }
        }
    )
    stack = cdk.Stack(cdk.App(), "NetworkOnly")
    network = worker_construct.WorkerNetwork(stack, "Network", config=config)
    template = Template.from_stack(stack).to_json()
    assert set(r["Type"] for r in template["Resources"].values()) == {"AWS::EC2::SecurityGroup"}
    assert network.public_ip is False
    assert [s.subnet_id for s in network.vpc.select_subnets(subnets=network.subnets.subnets).subnets] == list(
        config.network.subnet_ids
    )


# --- capacity -----------------------------------------------------------------------------------
def test_launch_templates_gpu_ami_imdsv2_encrypted_cache_volume(synth):
    templates = {
        k: r["Properties"]["LaunchTemplateData"] for k, r in synth.resources("AWS::EC2::LaunchTemplate").items()
    }
    assert len(templates) == sum(2 if m.spot else 1 for m in synth.config.models)
    ami = next(name for name in synth.json["Parameters"] if name.startswith("SsmParameterValue"))
    for index, model in enumerate(synth.config.models):
        for kind in ("OnDemand", "Spot") if model.spot else ("OnDemand",):
            (data,) = [d for k, d in templates.items() if k.startswith(f"WorkersModel{index}{kind}LaunchTemplate")]
            assert data["ImageId"] == {"Ref": ami}
            assert data["InstanceType"] == model.instance_type
            assert data["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
            (device,) = data["BlockDeviceMappings"]
            assert device == {
                "DeviceName": "/dev/xvda",
                "Ebs": {  # the ECS-optimized AMI's root device
                    "DeleteOnTermination": True,
                    "Encrypted": True,
                    "VolumeSize": model.volume_gib,
                    "VolumeType": "gp3",
                },
            }
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
    clusters = _workers(synth, "AWS::ECS::Cluster")
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
        assert container["MountPoints"] == [
            {"ContainerPath": "/root/.cache", "SourceVolume": "cache", "ReadOnly": False}
        ]
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
    secrets = {s["Name"]: s["ValueFrom"] for s in chat["Secrets"]}
    assert secrets["HF_TOKEN"] == _model(synth, "org/Chat-Model-7B").hf_token_secret_arn
    embed = _by_model(synth, "AWS::ECS::TaskDefinition")["embed-small"]["ContainerDefinitions"][0]
    assert [s["Name"] for s in embed["Secrets"]] == [
        "WORKER_CACHE_SALT_SECRET"
    ]  # every model's workers get their salt key
    for container in (chat, embed):
        salt = next(s["ValueFrom"] for s in container["Secrets"] if s["Name"] == "WORKER_CACHE_SALT_SECRET")
        assert (
            synth.json["Resources"][salt["Ref"]]["Type"] == "AWS::SecretsManager::Secret"
        )  # generated by the stack, never in the env
        assert "WORKER_CACHE_SALT_SECRET" not in {e["Name"] for e in container["Environment"]}


def test_image_asset_is_built_from_the_worker_dockerfile_with_only_what_it_copies(synth):
    manifest = json.loads((synth.outdir / f"{synth.stack.stack_name}.assets.json").read_text())
    images = {
        k: i
        for k, i in manifest["dockerImages"].items()
        if i["source"].get("dockerFile") != "functions/stream_front/Dockerfile"
    }  # test_stream_front.py
    engine_images = {m.engine_image for m in synth.config.models}
    assert len(images) == len(engine_images)  # one image per distinct engine image
    for image in images.values():
        source = image["source"]
        assert source["dockerFile"] == worker_construct.DOCKERFILE
        assert source["dockerBuildArgs"]["VLLM_IMAGE"] in engine_images
        assert source["platform"] == "linux/amd64"
        staged = synth.outdir / source["directory"]
        files = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
        assert {
            worker_construct.DOCKERFILE,
            "gpu_worker/entrypoint.sh",
            "gpu_worker/__main__.py",
            "functions/core/settings.py",
            "functions/core/names.py",
            "pyproject.toml",
        } <= files
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
        audit_queue = f"<{synth.logical_id(synth.stack.audit.queue)}.Arn>"
        assert {a for a, r in pairs if a.startswith("sqs:") and r != audit_queue} == {
            "sqs:ReceiveMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:DeleteMessage",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        }
        # Its own queue; and a chunk's audit receipt is sent to the audit queue, nothing more there.
        assert {r for a, r in pairs if a.startswith("sqs:")} == {f"<{queue}.Arn>", audit_queue}
        assert {a for a, r in pairs if r == audit_queue} == {"sqs:SendMessage"}
        s3 = {(a, r) for a, r in pairs if a.startswith("s3:")}
        assert {r for _, r in s3} == {
            f"<{bucket}.Arn>",
            f"<{bucket}.Arn>/batches/*/*/input.jsonl",
            f"<{bucket}.Arn>/batches/*/*/parts/*",
        }
        assert {a for a, r in s3 if r.endswith("/parts/*")} == {
            "s3:PutObject",
            "s3:PutObjectLegalHold",
            "s3:PutObjectRetention",
            "s3:PutObjectTagging",
            "s3:PutObjectVersionTagging",
            "s3:Abort*",
            "s3:GetObject*",
            "s3:GetBucket*",
            "s3:List*",  # a redelivered chunk reads its checkpoints
        }
        assert {a for a, r in s3 if r.endswith("input.jsonl")} == {"s3:GetObject*", "s3:GetBucket*", "s3:List*"}
        assert {r for a, r in pairs if a.startswith("dynamodb:")} == {f"<{table}.Arn>"}  # no index
        # No Query: the audit chains are the appender's (tests/infra/test_table_access.py pins the
        # partitions; BatchGetItem: a chunk's marker and run record, on chunk partitions only).
        assert {a for a, r in pairs if a.startswith("dynamodb:")} == {
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",
            "dynamodb:ConditionCheckItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        }
        assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:SendTaskSuccess", f"<{sm}>")}
        assert {a.split(":")[0] for a, _ in pairs} == {"sqs", "s3", "dynamodb", "states"}  # metrics are EMF logs


def _table_statements(synth, role_id: str) -> list[dict]:
    out = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                if any(a.startswith("dynamodb:") for a in actions):
                    out.append(statement)
    return out


def iam_allows(statement: dict, partition_key: str) -> bool:
    """Whether ``statement``'s condition lets a request on an item of ``partition_key`` through
    (``ForAllValues:StringLike`` on ``dynamodb:LeadingKeys``: IAM's ``*`` matches any characters)."""
    (operator_,) = statement["Condition"]
    assert operator_ == "ForAllValues:StringLike"
    patterns = statement["Condition"][operator_]["dynamodb:LeadingKeys"]
    patterns = patterns if isinstance(patterns, list) else [patterns]
    return any(fnmatch.fnmatchcase(partition_key, p) for p in patterns)


def test_task_role_reaches_batch_and_chunk_items_never_api_keys(synth):
    from functions.core import schema
    from functions.core.records import chunks_pk

    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        # The chunk path's statement (beside it: the budget charge on T#*#BUDGET, receipts on AUDIT#*).
        (statement,) = [
            s
            for s in _table_statements(synth, props["TaskRoleArn"]["Fn::GetAtt"][0])
            if iam_allows(s, "T#acme#BATCHES")
        ]
        assert statement["Effect"] == "Allow"
        # The worker's own items: a tenant's batches (T#<tenant>#BATCHES) and a batch's chunk
        # markers (T#<tenant>#B#<batch>); never the tenant's own partition (files, uploads).
        assert iam_allows(statement, "T#acme#BATCHES") and iam_allows(statement, "T#acme#B#batch_1")
        assert not iam_allows(statement, "T#acme")
        # Never an API key's item, nor the scaler's state.
        assert not iam_allows(statement, "KEY#9f86d081884c7d659a2feaa0c55ad015")
        assert not iam_allows(statement, "SCALER#" + name)
        assert not iam_allows(statement, schema.key_pk("abc"))
        assert iam_allows(statement, chunks_pk("t", "b"))


def test_execution_role_pulls_the_image_writes_logs_reads_the_token(synth):
    for name, props in _by_model(synth, "AWS::ECS::TaskDefinition").items():
        pairs = _role_permissions(synth, props["ExecutionRoleArn"]["Fn::GetAtt"][0])
        services = {a.split(":")[0] for a, _ in pairs}
        model = _model(synth, name)
        assert services == {"ecr", "logs", "secretsmanager"}  # the salt key, and the token if the model has one
        readable = {r for a, r in pairs if a.startswith("secretsmanager:")}
        token = model.hf_token_secret_arn
        assert len({r for r in readable if token is None or token not in r}) == 1  # its own salt key only


def test_instances_can_only_run_the_ecs_agent(synth):
    roles = {
        k for k, r in synth.resources("AWS::IAM::Role").items() if k.startswith("WorkersModel") and "InstanceRole" in k
    }
    assert len(roles) == len(synth.config.models)
    for role in roles:
        services = {a.split(":")[0] for a, _ in _role_permissions(synth, role)}
        assert services <= {"ecs", "ecr", "logs"}, services


# --- scaling (the scaler Lambda: tests/infra/test_scaler.py; its rule: tests/unit/test_scaler_logic.py)
def test_no_application_auto_scaling_on_the_services(synth):
    """One controller owns the desired count: the scaler. No scalable target, no step policy on a
    Container Insights series that has no datapoint at zero tasks, no scaling alarm."""
    # (The streaming front's service scales on its CPU: tests/infra/test_stream_front.py.)
    assert not _workers(synth, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert not _workers(synth, "AWS::ApplicationAutoScaling::ScalingPolicy")
    assert {k.split("Service")[0] for k in synth.resources("AWS::ApplicationAutoScaling::ScalableTarget")} <= {
        "StreamFront"
    }
    for alarm in synth.resources("AWS::CloudWatch::Alarm").values():
        for query in alarm["Properties"].get("Metrics", []):
            if "MetricStat" in query:
                assert query["MetricStat"]["Metric"]["Namespace"] != "ECS/ContainerInsights"
        assert alarm["Properties"].get("Namespace") != "ECS/ContainerInsights"


@pytest.mark.parametrize("name", ["org/Chat-Model-7B", "embed-small"])
def test_services_start_at_min_instances(synth, name):
    service = _by_model(synth, "AWS::ECS::Service")[name]
    assert service["DesiredCount"] == _model(synth, name).min_instances == 0
