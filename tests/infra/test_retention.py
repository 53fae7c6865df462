"""Retention of batch data (infra/constructs/storage.py ``batch_data_expiry_days``; docs/deploy.md,
"Retention"): the bucket's lifecycle removes every object under ``batches/`` a fixed number of days
after it was written, chosen so that it is never removed while its batch is open and at least
``batch_data_retention_days`` after the batch ended. Files (``files/``) are not batch data."""

import pytest
from pydantic import ValidationError

from functions.core import schema
from infra.config import DeployConfig
from infra.constructs.storage import BATCHES_PREFIX, batch_data_expiry_days

DAY = 86_400
#: What the sweeper allows past a batch's expiry before it ends it (docs/lifecycle.md, Liveness):
#: expiry grace 15 min + drain grace 2 min + one 5-minute sweep.
CLOSE_BOUND = 15 * 60 + 2 * 60 + 5 * 60


def test_default_schedule_is_a_week_after_the_batch_ends():
    # 24 h window + 22 min to close = 2 days (rounded up), + 1 day of slack, + 7 days retention.
    assert DeployConfig().batch_data_retention_days == 7
    assert batch_data_expiry_days(DeployConfig()) == 7 + 2 + 1


@pytest.mark.parametrize(
    ("retention", "windows", "days"),
    [
        (0, ("90m",), 0 + 1 + 1),
        (30, ("24h",), 30 + 2 + 1),
        (7, ("24h", "72h"), 7 + 4 + 1),  # the longest window decides
    ],
)
def test_schedule_follows_the_setting_and_the_longest_window(retention, windows, days):
    assert batch_data_expiry_days(DeployConfig(batch_data_retention_days=retention, completion_windows=windows)) == days


@pytest.mark.parametrize("retention", [0, 1, 7, 30])
@pytest.mark.parametrize("window_hours", [1, 24, 48])
def test_never_while_open_and_at_least_the_retention_after_the_end(retention, window_hours):
    """A batch created at 0 ends by ``window + CLOSE_BOUND``; its objects are written between 0 and
    its end. The earliest one (written at 0) must outlive the latest end by the retention."""
    config = DeployConfig(batch_data_retention_days=retention, completion_windows=(f"{window_hours}h",))
    expiry = batch_data_expiry_days(config) * DAY
    latest_end = window_hours * 3600 + CLOSE_BOUND
    assert 0 + expiry >= latest_end + retention * DAY
    # ...and not much more than that: within the longest open time plus a day of slack.
    assert expiry <= retention * DAY + latest_end + 2 * DAY


def test_retention_is_validated():
    for bad in (-1, 3651):
        with pytest.raises(ValidationError):
            DeployConfig(batch_data_retention_days=bad)


def test_the_rule_covers_every_batch_key_and_no_file():
    keys = [
        schema.batch_input_key("t", "b"),
        schema.batch_manifest_key("t", "b"),
        schema.chunk_part_key("t", "b", 3, "a1", "out"),
        schema.chunk_checkpoint_key("t", "b", 3, 0, 10),
    ]
    assert all(k.startswith(BATCHES_PREFIX) for k in keys) and BATCHES_PREFIX == "batches/"
    assert not schema.file_key("t", "file-abc").startswith(BATCHES_PREFIX)
    assert not schema.upload_part_key("t", "u", "p").startswith(BATCHES_PREFIX)


def test_the_bucket_has_the_batch_data_rule(synth):
    props = synth.resources("AWS::S3::Bucket")[synth.logical_id(synth.stack.storage.bucket)]["Properties"]
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    rule = rules["expire-batch-data"]
    assert rule["Prefix"] == "batches/"
    assert rule["Status"] == "Enabled"
    # The session config keeps the defaults: 7 days after the end, 24 h windows.
    assert rule["ExpirationInDays"] == 7 + 2 + 1
