"""Lambda functions: the bundled code asset, runtime, environment from Settings, least privilege."""

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from functions.core.records import FileRecord
from functions.core.settings import Settings
from infra import names
from infra.constructs import lambdas
from infra.constructs.reaper import stream_filter

HANDLERS = {
    "api": "functions.api.handler.handler",
    "authorizer": "functions.authorizer.handler.handler",
    "reaper": "functions.reaper.handler.handler",
    "ingest": "functions.ingest.handler.handler",
    "workflow": "functions.workflow.handler.handler",
    "dlq": "functions.chunk_dlq.handler.handler",
    "ingest_dlq": "functions.ingest_dlq.handler.handler",
    "sweeper": "functions.sweeper.handler.handler",
    "scaler": "functions.scaler.handler.handler",
    "assembler": "functions.assembler.handler.handler",
    "webhooks": "functions.webhooks.handler.handler",
    "audit_append": "functions.audit_append.handler.handler",
}
#: CDK's own function that writes the bucket's notification configuration at deploy time.
CDK_NOTIFICATIONS_HANDLER = "BucketNotificationsHandler050a0587b7544547bf325f094a3db834"


def ours(synth) -> dict[str, dict]:
    """The stack's own functions (CDK's notification handler aside)."""
    found = synth.resources("AWS::Lambda::Function")
    cdk_own = {k for k in found if k.startswith(CDK_NOTIFICATIONS_HANDLER)}
    assert len(cdk_own) == 1
    return {k: r for k, r in found.items() if k not in cdk_own}


def _functions(synth) -> dict[str, tuple[str, dict]]:
    """label -> (logical id, properties) for each function, found by its handler."""
    by_handler = {r["Properties"]["Handler"]: (k, r["Properties"]) for k, r in ours(synth).items()}
    assert set(by_handler) == set(HANDLERS.values())
    return {label: by_handler[h] for label, h in HANDLERS.items()}


def expected_settings_env(synth) -> dict[str, str]:
    """``Settings.to_env()`` of the deployment, with its resources as template placeholders."""
    queues = synth.stack.ingest.work_queues
    arn = f"arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:stateMachine:{names.state_machine_name(names.STACK_NAME)}"
    return (
        synth.config.settings(
            table_name=f"<{synth.one('AWS::DynamoDB::Table')[0]}>",
            bucket_name=f"<{synth.logical_id(synth.stack.storage.bucket)}>",
            queue_urls={name: f"<{synth.logical_id(queue)}>" for name, queue in queues.items()},
            state_machine_arn=arn,
            event_bus_name=names.event_bus_name(names.STACK_NAME),  # the stack's bus, by its name
        )
        .model_copy(
            update={
                "assembly_queue_url": f"<{synth.logical_id(synth.stack.uploads.queue)}>",
                "webhook_queue_url": f"<{synth.logical_id(synth.stack.webhooks.queue)}>",
                "webhook_dead_letter_queue_url": f"<{synth.logical_id(synth.stack.webhooks.dead_letters)}>",
                "audit_queue_url": f"<{synth.logical_id(synth.stack.audit.queue)}>",
            }
        )
        .to_env()
    )


def _asset_dir(synth) -> Path:
    keys = {p["Code"]["S3Key"] for _, p in _functions(synth).values()}
    assert len(keys) == 1, "all functions share one code asset"
    (path,) = synth.outdir.glob("asset." + keys.pop().removesuffix(".zip"))
    return path


def test_runtime_and_architecture(synth):
    for _, props in _functions(synth).values():
        assert props["Runtime"] == lambdas.RUNTIME.name == "python3.12"
        assert props["Architectures"] == ["arm64"]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert "Ref" in props["LoggingConfig"]["LogGroup"]


def test_environment_is_exactly_settings_to_env(synth):
    expected = expected_settings_env(synth)
    for label, (_, props) in _functions(synth).items():
        if label == "scaler":  # its own two variables (tests/infra/test_scaler.py)
            continue
        env = {k: synth.render(v) for k, v in props["Environment"]["Variables"].items()}
        if label == "audit_append":  # the one function that knows the locked bucket and the signing key
            assert env.pop(Settings.env_name("audit_bucket_name")) == f"<{synth.logical_id(synth.stack.audit.bucket)}>"
            assert (
                env.pop(Settings.env_name("audit_signing_key_id")) == f"<{synth.logical_id(synth.stack.audit.key)}.Arn>"
            )
            env[Settings.env_name("audit_bucket_name")] = env[Settings.env_name("audit_signing_key_id")] = ""
        assert env == expected, label


def test_settings_name_every_model_with_its_endpoints_and_queue(synth):
    models = json.loads(expected_settings_env(synth)["BATCHAPI_MODELS"])
    assert list(models) == [m.name for m in synth.config.models]
    for model in synth.config.models:
        queue = synth.stack.ingest.work_queues[model.name]
        assert models[model.name] == {
            "endpoints": list(model.endpoints),
            "queue_url": f"<{synth.logical_id(queue)}>",
            "max_engines": model.max_instances,  # ingest cuts a big batch into a chunk for each
        }
    assert models["embed-small"]["endpoints"] == ["/v1/embeddings"]


def test_code_asset_is_functions_package_with_aarch64_dependencies(synth):
    asset = _asset_dir(synth)
    for handler in HANDLERS.values():
        module = handler.rsplit(".", 1)[0]
        assert (asset / (module.replace(".", "/") + ".py")).is_file(), handler
    assert (asset / "functions" / "core" / "schema.py").is_file()
    assert not list(asset.rglob("__pycache__")), "no bytecode from the build machine"
    # The compiled dependency was picked for the Lambda runtime, not for this machine.
    (core,) = (asset / "pydantic_core").glob("_pydantic_core.*.so")
    assert core.name.endswith("cpython-312-aarch64-linux-gnu.so")
    installed = {
        d.metadata["Name"].lower().replace("_", "-") for d in importlib.metadata.distributions(path=[str(asset)])
    }
    for requirement in lambdas.runtime_requirements():
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in installed, requirement
    assert not (asset / "moto").exists() and not (asset / "aws_cdk").exists(), "only run-time dependencies"


def test_reaper_reads_remove_events_of_file_items_and_of_uploads_holding_stored_bytes(synth):
    (props,) = [
        m["Properties"]
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": _functions(synth)["reaper"][0]}
    ]
    assert props["EventSourceArn"] == {"Fn::GetAtt": [synth.one("AWS::DynamoDB::Table")[0], "StreamArn"]}
    assert props["FunctionName"] == {"Ref": _functions(synth)["reaper"][0]}
    flt, uploads = props["FilterCriteria"]["Filters"]
    assert json.loads(flt["Pattern"]) == {
        "eventName": ["REMOVE"],
        "dynamodb": {"OldImage": {"sk": {"S": [{"prefix": FileRecord.sort_key("")}]}}},
    }
    assert json.loads(flt["Pattern"]) == json.loads(json.dumps(synth.stack.resolve(stream_filter())))
    # An upload that still held stored bytes when its record went (expired, or cancelled): its release.
    assert json.loads(uploads["Pattern"])["dynamodb"]["OldImage"]["holds_storage"] == {"BOOL": [True]}
    assert props["BisectBatchOnFunctionError"] is True
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.reaper.dead_letters), "Arn"]
    }


# --- IAM: each function can do what it needs and no more ---------------------------------------
def _permissions(synth, label: str) -> list[tuple[str, str]]:
    """(action, resource) pairs granted to the function's role, resources as JSON text."""
    _, props = _functions(synth)[label]
    return synth.permissions(props["Role"]["Fn::GetAtt"][0])


def _on(pairs, service: str) -> set[str]:
    return {a for a, _ in pairs if a.startswith(service + ":")}


def _ref(logical_id: str, attr: str = "Arn") -> str:
    return json.dumps({"Fn::GetAtt": [logical_id, attr]})


def _objects(logical_id: str) -> str:
    return json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [logical_id, "Arn"]}, "/*"]]})


@pytest.fixture(scope="module")
def ids(synth):
    return {
        "table": synth.one("AWS::DynamoDB::Table")[0],
        "bucket": synth.logical_id(synth.stack.storage.bucket),
    }


def _log_and_trace_only(pairs, log_group_id):
    assert _on(pairs, "logs") == {"logs:CreateLogStream", "logs:PutLogEvents"}
    assert {r for a, r in pairs if a.startswith("logs:")} == {_ref(log_group_id)}
    assert {r for a, r in pairs if a.startswith("xray:")} <= {'"*"'}


def test_api_lambda_reads_and_writes_table_and_bucket(synth, ids):
    pairs = _permissions(synth, "api")
    table_actions = {a for a, r in pairs if r == _ref(ids["table"])}
    assert {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:Query",
        "dynamodb:BatchGetItem",
        "dynamodb:ConditionCheckItem",
    } <= table_actions
    object_actions = {a for a, r in pairs if r == _objects(ids["bucket"])}
    assert {"s3:PutObject", "s3:GetObject*", "s3:DeleteObject*", "s3:Abort*"} <= object_actions
    assert "s3:List*" in {a for a, r in pairs if r == _ref(ids["bucket"])}
    # Nothing beyond its table, its bucket, its logs and tracing.
    assert _on(pairs, "dynamodb") == table_actions
    assert {r for a, r in pairs if a.startswith("s3:")} == {_objects(ids["bucket"]), _ref(ids["bucket"])}
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "s3", "states", "logs", "xray", "sqs"}
    # sqs: handing a large upload to the assembler (docs/uploads.md), and sending its audit
    # intents (docs/audit.md: SendMessage only)
    audit_queue = _ref(synth.logical_id(synth.stack.audit.queue))
    assert {r for a, r in pairs if a.startswith("sqs:")} == {
        json.dumps({"Fn::GetAtt": [synth.logical_id(synth.stack.uploads.queue), "Arn"]}),
        audit_queue,
    }
    assert {a for a, r in pairs if r == audit_queue} == {"sqs:SendMessage"}
    assert "s3:PutObjectAcl" not in object_actions


def test_authorizer_can_only_read_api_keys(synth, ids):
    pairs = _permissions(synth, "authorizer")
    assert [(a, r) for a, r in pairs if a.startswith("dynamodb:")] == [("dynamodb:GetItem", _ref(ids["table"]))]
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "logs", "xray"}
    _log_and_trace_only(pairs, _functions(synth)["authorizer"][1]["LoggingConfig"]["LogGroup"]["Ref"])


def test_reaper_can_only_delete_objects_and_release_stored_bytes(synth, ids):
    pairs = _permissions(synth, "reaper")
    assert {(a, r) for a, r in pairs if a.startswith("s3:")} == {("s3:DeleteObject*", _objects(ids["bucket"]))}
    stream = _ref(ids["table"], "StreamArn")
    dynamo = {(a, r) for a, r in pairs if a.startswith("dynamodb:")}
    assert dynamo == {
        ("dynamodb:DescribeStream", stream),
        ("dynamodb:GetRecords", stream),
        ("dynamodb:GetShardIterator", stream),
        ("dynamodb:ListStreams", '"*"'),  # no resource-level permissions for ListStreams
        # A release on the stored-bytes ledger (items of T#*#STORAGE only: tests/infra/test_api_access.py).
        ("dynamodb:DeleteItem", _ref(ids["table"], "Arn")),
        ("dynamodb:UpdateItem", _ref(ids["table"], "Arn")),
    }
    dlq = _ref(synth.logical_id(synth.stack.reaper.dead_letters))
    assert {r for a, r in pairs if a.startswith("sqs:")} == {dlq}
    assert "sqs:SendMessage" in _on(pairs, "sqs")
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "s3", "sqs", "logs", "xray"}
    _log_and_trace_only(pairs, _functions(synth)["reaper"][1]["LoggingConfig"]["LogGroup"]["Ref"])


# --- the batch functions ------------------------------------------------------------------------
def _state_machine(synth) -> str:
    return json.dumps({"Ref": synth.logical_id(synth.stack.workflow.state_machine)})


def _keys(bucket_id: str, pattern: str) -> str:
    return json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, "/" + pattern]]})


def _batch_bus(synth, pairs) -> set[str]:
    """Where the role may put events: the stack's batch event bus, nowhere else."""
    resources = {r for a, r in pairs if a == "events:PutEvents"}
    assert resources == {_ref(synth.logical_id(synth.stack.events.bus))}, resources
    return resources


READ = {"s3:GetObject*", "s3:GetBucket*", "s3:List*"}
PUT = {
    "s3:PutObject",
    "s3:PutObjectLegalHold",
    "s3:PutObjectRetention",
    "s3:PutObjectTagging",
    "s3:PutObjectVersionTagging",
    "s3:Abort*",
}


def _s3(pairs) -> dict[str, set[str]]:
    by_resource: dict[str, set[str]] = {}
    for action, resource in pairs:
        if action.startswith("s3:"):
            by_resource.setdefault(resource, set()).add(action)
    return by_resource


def test_api_lambda_may_resume_a_workflow_and_nothing_else_of_it(synth):
    pairs = _permissions(synth, "api")
    assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:SendTaskSuccess", _state_machine(synth))}


#: label -> (object keys it reads, object keys it writes, AWS services it uses besides logs and X-Ray)
BATCH_FUNCTIONS = {
    "ingest": ("batches/*/*/*", "batches/*/*/chunks.json", {"dynamodb", "s3", "sqs", "states", "events"}),
    "workflow": ("batches/*/*/*", "files/*/*", {"dynamodb", "s3", "states", "events"}),
    "dlq": ("batches/*/*/input.jsonl", "batches/*/*/parts/*", {"dynamodb", "s3", "sqs", "states"}),
    # finalizes an overdue batch as the workflow does, and redoes a fan-out as ingest does
    "sweeper": ("batches/*/*/*", "files/*/*", {"dynamodb", "s3", "sqs", "states", "events"}),
}


@pytest.mark.parametrize("label", BATCH_FUNCTIONS)
def test_batch_functions_read_and_write_only_their_keys(synth, ids, label):
    reads, writes, services = BATCH_FUNCTIONS[label]
    pairs = _permissions(synth, label)
    bucket = ids["bucket"]
    # the DLQ reads the checkpoints under parts/ it writes beside (it keeps a chunk's checkpointed lines)
    written = PUT | READ if label == "dlq" else PUT
    assert _s3(pairs) == {_ref(bucket): READ, _keys(bucket, reads): READ, _keys(bucket, writes): written}
    # ingest, the DLQ consumer and the workflow: the table's items only, no index (their partitions and actions:
    # tests/infra/test_table_access.py)
    index = set() if label in ("ingest", "dlq", "workflow") else {_objects(ids["table"]).replace("/*", "/index/*")}
    assert {r for a, r in pairs if a.startswith("dynamodb:")} == {_ref(ids["table"]), *index}
    assert {a.split(":")[0] for a, _ in pairs} == services | {"logs", "xray"}
    _log_and_trace_only(pairs, _functions(synth)[label][1]["LoggingConfig"]["LogGroup"]["Ref"])


def test_ingest_consumes_its_queue_enqueues_chunks_starts_and_publishes(synth):
    pairs = _permissions(synth, "ingest")
    ingest_queue = _ref(synth.logical_id(synth.stack.ingest.ingest_queue))
    work_queues = {_ref(synth.logical_id(q)) for q in synth.stack.ingest.work_queues.values()}
    assert {r for a, r in pairs if a == "sqs:SendMessage"} == work_queues
    assert {r for a, r in pairs if a == "sqs:ReceiveMessage"} == {ingest_queue}
    assert {a for a, r in pairs if r in work_queues} == {"sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}
    assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:StartExecution", _state_machine(synth))}
    assert len(_batch_bus(synth, pairs)) == 1 and _on(pairs, "events") == {"events:PutEvents"}


def test_workflow_signals_by_the_state_machines_name_and_publishes(synth):
    pairs = _permissions(synth, "workflow")
    # SendTaskSuccess on the state machine's ARN built from its name (a Ref would be circular).
    (signal,) = [(a, r) for a, r in pairs if a.startswith("states:")]
    assert signal[0] == "states:SendTaskSuccess"
    assert synth.render(json.loads(signal[1])) == (
        "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:stateMachine:"
        + names.state_machine_name(names.STACK_NAME)
    )
    assert len(_batch_bus(synth, pairs)) == 1
    assert "s3:DeleteObject*" not in _on(pairs, "s3")


def test_dlq_handler_consumes_the_work_dlqs_and_signals(synth):
    pairs = _permissions(synth, "dlq")
    dead_letters = {_ref(synth.logical_id(q)) for q in synth.stack.ingest.work_dead_letters.values()}
    audit_queue = _ref(synth.logical_id(synth.stack.audit.queue))  # a counted chunk's receipt: SendMessage only
    assert {r for a, r in pairs if a.startswith("sqs:")} == dead_letters | {audit_queue}
    assert {a for a, r in pairs if r == audit_queue} == {"sqs:SendMessage"}
    assert "sqs:SendMessage" not in {a for a, r in pairs if r in dead_letters}
    assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:SendTaskSuccess", _state_machine(synth))}


def test_ingest_dlq_handler_consumes_the_ingest_dlq_reads_manifests_enqueues_and_starts(synth, ids):
    """It only reads a batch's chunk manifest (a retried fan-out), sends to the work queues and
    starts the workflow; it neither writes objects nor signals."""
    pairs = _permissions(synth, "ingest_dlq")
    bucket = ids["bucket"]
    assert _s3(pairs) == {_ref(bucket): READ, _keys(bucket, "batches/*/*/chunks.json"): READ}
    assert {r for a, r in pairs if a == "sqs:ReceiveMessage"} == {
        _ref(synth.logical_id(synth.stack.ingest.ingest_dead_letters))
    }
    work_queues = {_ref(synth.logical_id(q)) for q in synth.stack.ingest.work_queues.values()}
    assert {r for a, r in pairs if a == "sqs:SendMessage"} == work_queues
    assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:StartExecution", _state_machine(synth))}
    assert len(_batch_bus(synth, pairs)) == 1 and _on(pairs, "events") == {"events:PutEvents"}
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "s3", "sqs", "states", "events", "logs", "xray"}


def test_sweeper_enqueues_starts_and_publishes_but_never_consumes_or_signals(synth):
    pairs = _permissions(synth, "sweeper")
    work_queues = {_ref(synth.logical_id(q)) for q in synth.stack.ingest.work_queues.values()}
    assert {r for a, r in pairs if a.startswith("sqs:")} == work_queues
    assert "sqs:ReceiveMessage" not in _on(pairs, "sqs")
    assert {(a, r) for a, r in pairs if a.startswith("states:")} == {("states:StartExecution", _state_machine(synth))}
    assert len(_batch_bus(synth, pairs)) == 1
    assert "s3:DeleteObject*" not in _on(pairs, "s3")


def test_only_the_functions_that_emit_events_may_publish(synth):
    for label in HANDLERS:
        may = bool(_on(_permissions(synth, label), "events"))
        assert may == (label in ("ingest", "workflow", "ingest_dlq", "sweeper")), label


def test_batch_functions_have_room_for_their_work(synth):
    fns = _functions(synth)
    assert fns["ingest"][1]["Timeout"] == 600 and fns["workflow"][1]["Timeout"] == 900
    assert fns["dlq"][1]["Timeout"] == 300
    # the sweeper may finalize a batch as the workflow's finalize does (up to 200 MB of input)
    assert fns["sweeper"][1]["Timeout"] == 600 and fns["ingest_dlq"][1]["Timeout"] == 120
