"""batchctl's progress bar (``batches wait``) and retry selection, with no API: an injected clock
and sleep, a scripted status sequence, and error-file lines written by hand."""

import io
import json
from types import SimpleNamespace

import pytest

from batchctl import batches as b


def batch(status: str, completed: int = 0, failed: int = 0, total: int = 0, **extra):
    counts = SimpleNamespace(completed=completed, failed=failed, total=total)
    return SimpleNamespace(id="batch_1", status=status, request_counts=counts, **extra)


# --- the bar ---------------------------------------------------------------------------------


def test_render_shows_bar_percentage_rate_and_eta():
    text = b.render("in_progress", 250, 10, 1000, 12.5, width=20)
    # 250 of 1000: a quarter of the bar, 25 %; 750 left at 12.5 lines/s is 60 s
    assert text == "in_progress [#####               ] 250/1000  25% failed 10 12.5 lines/s ETA 1:00"


def test_render_at_100_percent_has_a_full_bar_and_no_eta():
    text = b.render("finalizing", 1000, 3, 1000, 40.0, width=10)
    assert text == "finalizing  [##########] 1000/1000 100% failed 3 40.0 lines/s"


def test_render_unknown_total_and_unmeasured_rate():
    assert b.render("validating", 0, 0, 0, None, width=4) == "validating  [    ] 0/?"
    assert b.render("in_progress", 5, 0, 10, None, width=4).endswith(" 50% failed 0 ETA ?")
    assert b.render("in_progress", 5, 0, 10, 0.0, width=4).endswith(" 0.0 lines/s ETA ?")  # stalled


def test_eta_over_an_hour_has_hours():
    assert b.render("in_progress", 0, 0, 7300, 2.0, width=4).endswith("ETA 1:00:50")  # 3650 s


def test_rate_is_lines_since_the_first_observation_over_the_time_since():
    p = b.Progress(width=4)
    assert "lines/s" not in p.line("in_progress", 100, 0, 1000, now=50.0)  # baseline: 100 done at t=50
    text = p.line("in_progress", 400, 0, 1000, now=70.0)  # 300 lines in 20 s
    assert "15.0 lines/s" in text and "ETA 0:40" in text  # 600 left at 15/s


# --- wait --------------------------------------------------------------------------------------


class Statuses:
    """``client.batches.retrieve`` answering a scripted sequence; a clock moved by ``sleep``."""

    def __init__(self, *sequence):
        self.sequence = list(sequence)
        self.now = 0.0
        self.batches = SimpleNamespace(retrieve=lambda batch_id: self.sequence.pop(0))

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_wait_on_a_terminal_redraws_one_line_with_rate_and_eta():
    api = Statuses(
        batch("validating"),
        batch("in_progress", 0, 0, 100),
        batch("in_progress", 38, 2, 100),
        batch("completed", 98, 2, 100),
    )
    err = io.StringIO()
    done = b.wait_for(api, "batch_1", timeout=0, interval=10, err=err, sleep=api.sleep, clock=api.clock, tty=True)
    assert done.status == "completed"
    frames = err.getvalue().split("\r")[1:]
    assert len(frames) == 4 and err.getvalue().count("\n") == 1 and err.getvalue().endswith("\n")
    assert "0/?" in frames[0]
    assert "40/100" in frames[2] and "4.0 lines/s" in frames[2] and "ETA 0:15" in frames[2]  # 40 in 10 s
    assert "100/100 100%" in frames[3] and "5.0 lines/s" in frames[3] and "ETA" not in frames[3]


def test_wait_off_a_terminal_prints_a_line_per_change_or_per_minute():
    same = batch("in_progress", 10, 0, 100)
    api = Statuses(batch("in_progress", 0, 0, 100), *[same] * 8, batch("failed", 10, 0, 100))
    err = io.StringIO()
    done = b.wait_for(api, "batch_1", timeout=0, interval=10, err=err, sleep=api.sleep, clock=api.clock, tty=False)
    lines = err.getvalue().splitlines()
    assert done.status == "failed" and "\r" not in err.getvalue()
    # t=0 (first), t=10 (changed), t=70 (unchanged for 60 s), t=90 (terminal)
    assert [l.split()[0] for l in lines] == ["in_progress", "in_progress", "in_progress", "failed"]
    assert "10/100" in lines[1] and "10/100" in lines[2]


_WAIT = b.wait_for


def scripted_wait(monkeypatch, api: Statuses) -> None:
    """``run``'s wait uses the scripted clock and sleep, off a terminal."""
    monkeypatch.setattr(
        b,
        "wait_for",
        lambda client, batch_id, **kw: _WAIT(client, batch_id, sleep=api.sleep, clock=api.clock, tty=False, **kw),
    )


def test_wait_times_out_with_exit_code_3(monkeypatch):
    api = Statuses(*[batch("in_progress", 1, 0, 10)] * 5)
    scripted_wait(monkeypatch, api)
    args = SimpleNamespace(command="batches", action="wait", batch_id="batch_1", timeout=15, interval=10)
    out, err = io.StringIO(), io.StringIO()
    assert b.run(args, api, out=out, err=err) == 3
    assert out.getvalue() == "" and "still in_progress after 15s" in err.getvalue()
    assert api.now == 20  # polled at 0, 10, 20: the deadline (15) passed


def test_wait_exit_codes_by_final_status(monkeypatch):
    for status, code in (("completed", 0), ("failed", 1), ("expired", 1), ("cancelled", 1)):
        api = Statuses(batch(status, 1, 0, 1))
        scripted_wait(monkeypatch, api)
        api.sequence[0].model_dump_json = lambda: "{}"
        args = SimpleNamespace(command="batches", action="wait", batch_id="batch_1", timeout=0, interval=1)
        assert b.run(args, api, out=io.StringIO(), err=io.StringIO()) == code, status


# --- retry selection ---------------------------------------------------------------------------


def err_line(custom_id, code=None, status=None):
    response = {"status_code": status, "request_id": "r", "body": {}} if status else None
    error = {"code": code, "message": "m"} if code else None
    return json.dumps({"id": "x", "custom_id": custom_id, "response": response, "error": error}).encode()


@pytest.mark.parametrize(
    "line, cls",
    [
        (err_line("a", "batch_expired"), "never_ran"),
        (err_line("a", "batch_cancelled"), "never_ran"),
        (err_line("a", "batch_failed"), "never_ran"),
        (err_line("a", "engine_crashed"), "transient"),
        (err_line("a", "chunk_failed"), "transient"),
        (err_line("a", "server_error"), "transient"),
        (err_line("a", "engine_connection_error"), "transient"),
        (err_line("a", "some_future_code"), "transient"),
        (err_line("a", status=500), "transient"),
        (err_line("a", status=503), "transient"),
        (err_line("a", status=429), "transient"),
        (err_line("a", status=408), "transient"),
        (err_line("a", status=400), "rejected"),
        (err_line("a", status=404), "rejected"),
        (err_line("a", "response_too_large"), "rejected"),
        (err_line("a", "invalid_json_line"), "invalid"),
        (err_line("a", "invalid_url"), "invalid"),
    ],
)
def test_retry_class(line, cls):
    assert b.retry_class(json.loads(line)) == cls


def test_plan_by_selection_and_the_skipped_reasons():
    done = batch("completed", error_file_id="file_e")
    lines = [
        err_line("a", status=400),
        err_line("b", "batch_expired"),
        err_line("c", "engine_crashed"),
        err_line("d", "invalid_url"),
    ]
    assert b.plan_retry(done, lines, "never-ran").custom_ids == ["b"]
    plan = b.plan_retry(done, lines, "retryable")
    assert plan.custom_ids == ["b", "c"] and plan.total == 4
    assert dict(plan.skipped) == {"status 400": 1, "invalid_url": 1}
    assert b.plan_retry(done, lines, "all").custom_ids == ["a", "b", "c"]


def test_plan_refusals():
    errors = SimpleNamespace(data=[SimpleNamespace(code="invalid_json_line", message="Line 3 is not JSON.", line=3)])
    with pytest.raises(b.RetryRefused, match=r"failed validation.*invalid_json_line.*line 3"):
        b.plan_retry(batch("failed", error_file_id=None, errors=errors), [], "retryable")
    with pytest.raises(b.RetryRefused, match="still in_progress"):
        b.plan_retry(batch("in_progress", error_file_id=None), [], "retryable")
    with pytest.raises(b.RetryRefused, match="no error file"):
        b.plan_retry(batch("completed", error_file_id=None, errors=None), [], "retryable")


def test_select_lines_keeps_input_order_and_bytes():
    rows = [b'{"custom_id": "r1", "x": 1}', b'{"custom_id":"r2"}', b"not json", b'{"custom_id": "r3"}']
    missing = {"r3", "r1", "gone"}
    assert list(b.select_lines(rows, missing)) == [rows[0], rows[3]] and missing == {"gone"}


def test_lines_split_across_chunks_crlf_and_no_final_newline():
    assert list(b._lines([b"ab", b"c\r\n\n  \nd", b"e"])) == [b"abc", b"de"]


def test_retry_metadata_limit_and_parent():
    assert b.retry_metadata(None, "batch_1") == ({"retry_of": "batch_1"}, True)
    full = {f"k{i}": "v" for i in range(16)}
    assert b.retry_metadata(full, "batch_1") == (full, False)
    # a retry of a retry: 16 pairs including retry_of: it now names the batch retried
    chained = {**{f"k{i}": "v" for i in range(15)}, "retry_of": "batch_0"}
    assert b.retry_metadata(chained, "batch_1") == ({**chained, "retry_of": "batch_1"}, True)
