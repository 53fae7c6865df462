"""The local moto server remembers each host's backend (infra/local/moto_dispatch.py): the same
backend as moto finds, found once per host."""

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from infra.local import moto_dispatch


def test_each_host_s_backend_is_moto_s_own_and_found_once(monkeypatch):
    hosts = ["dynamodb", "s3.us-east-1.amazonaws.com", "sqs.us-east-1.amazonaws.com", "moto_api", None]
    plain = DomainDispatcherApplication(create_backend_app)
    expected = {h: plain.get_backend_for_host(h) for h in hosts}
    looked: list[object] = []
    find = DomainDispatcherApplication.get_backend_for_host
    monkeypatch.setattr(
        DomainDispatcherApplication,
        "get_backend_for_host",
        lambda self, host: looked.append(host) or find(self, host),
    )
    monkeypatch.setattr(moto_dispatch, "_installed", False)
    moto_dispatch.install()
    app = DomainDispatcherApplication(create_backend_app)
    assert {h: app.get_backend_for_host(h) for h in hosts * 3} == expected
    assert looked == hosts  # each host looked up once
    assert expected["dynamodb"] == "dynamodb" and expected["sqs.us-east-1.amazonaws.com"] == "sqs"
