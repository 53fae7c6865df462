"""The local moto server's Step Functions interpreter keeps the boto3 clients it builds for its
tasks (infra/local/moto_sfn_clients.py): the client moto builds, built once per region, service and
role, also for the modules of moto's parser that imported the function by name."""

from dataclasses import dataclass

from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.utils import boto_client

from infra.local import moto_sfn_clients


@dataclass
class Role:  # as moto's StateCredentials: a dataclass, so not hashable
    role_arn: str


def test_a_task_s_client_is_built_once_per_region_service_and_role(monkeypatch):
    built: list[tuple[str, str]] = []
    build = boto_client.boto_client_for

    def counting(region, service, state_credentials=None):
        built.append((region, service))
        return build(region=region, service=service, state_credentials=state_credentials)

    monkeypatch.setattr(boto_client, "boto_client_for", counting)
    monkeypatch.setattr(lambda_eval_utils, "boto_client_for", counting)  # imported by name
    monkeypatch.setattr(moto_sfn_clients, "_installed", False)
    moto_sfn_clients.install()

    keep = boto_client.boto_client_for
    assert lambda_eval_utils.boto_client_for is keep
    first = keep(region="us-east-1", service="lambda", state_credentials=None)
    assert keep(region="us-east-1", service="lambda", state_credentials=None) is first
    assert keep("us-east-1", "lambda") is first
    assert first.meta.service_model.service_name == "lambda" and first.meta.region_name == "us-east-1"
    other = keep(region="us-east-1", service="events", state_credentials=None)
    assert other is not first and other.meta.service_model.service_name == "events"
    role = keep(region="us-east-1", service="lambda", state_credentials=Role("arn:aws:iam::1:role/a"))
    assert role is not first
    assert keep(region="us-east-1", service="lambda", state_credentials=Role("arn:aws:iam::1:role/a")) is role
    assert keep(region="eu-west-1", service="lambda") is not first
    assert built == [("us-east-1", "lambda"), ("us-east-1", "events"), ("us-east-1", "lambda"), ("eu-west-1", "lambda")]
