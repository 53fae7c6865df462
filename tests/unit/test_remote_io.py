"""``batchctl run-batch`` with ``http(s)`` input and output (``gpu_worker.remote_io``), against a
loopback server that plays a presigned S3 GET and PUT pair: the input streamed, the output PUT once
with its Content-Length from a temporary file that is gone afterwards, transient failures retried
with backoff, a refused URL not retried, nothing sent for a run that failed."""

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import batchctl
from gpu_worker import remote_io
from gpu_worker.remote_io import RemoteError, Retries
from tests.fakes.engine import FakeEngine, chat_answer


class Bucket:
    """Objects by path; ``fail_puts`` answers the next PUTs with 503, ``refuse`` these paths with
    403; every PUT's headers and body are kept."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[tuple[str, dict[str, str], bytes]] = []
        self.gets: list[str] = []
        self.fail_puts = 0
        self.fail_gets = 0
        self.refuse: set[str] = set()
        bucket = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                bucket.gets.append(path)
                if bucket.fail_gets:
                    bucket.fail_gets -= 1
                    return self._answer(503, b"SlowDown")
                if path in bucket.refuse:
                    return self._answer(403, b"<Error><Code>AccessDenied</Code></Error>")
                if path not in bucket.objects:
                    return self._answer(404, b"NoSuchKey")
                self._answer(200, bucket.objects[path])

            def do_PUT(self) -> None:
                path = self.path.split("?")[0]
                body = self.rfile.read(int(self.headers["Content-Length"]))
                bucket.puts.append((path, dict(self.headers), body))
                if bucket.fail_puts:
                    bucket.fail_puts -= 1
                    return self._answer(503, b"SlowDown")
                if path in bucket.refuse:
                    return self._answer(403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>")
                bucket.objects[path] = body
                self._answer(200)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bucket():
    b = Bucket()
    yield b
    b.close()


@pytest.fixture
def engine():
    e = FakeEngine().start()
    e.respond = lambda path, body, seen: (200, chat_answer(body))
    yield e
    e.stop()


def lines(n: int) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]},
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


def run_batch(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    code = batchctl.main(["run-batch", *args], env={}, out=io.StringIO(), err=err)
    return code, err.getvalue()


def test_a_presigned_get_and_put_pair_runs_the_batch(bucket, engine, tmp_path):
    bucket.objects["/in.jsonl"] = lines(40)
    signed = "?X-Amz-Signature=secret&X-Amz-Expires=300"
    code, err = run_batch(
        "-i", f"{bucket.url}/in.jsonl{signed}", "-o", f"{bucket.url}/out.jsonl{signed}",
        "--output-tmp-dir", str(tmp_path), "--engine-url", engine.url,
    )  # fmt: skip
    assert code == 0, err
    assert "40 completed, 0 failed" in err
    ((path, headers, body),) = bucket.puts
    assert path == "/out.jsonl" and int(headers["Content-Length"]) == len(body)
    assert "chunked" not in headers.get("Transfer-Encoding", "")  # S3 refuses a PUT without a length
    assert [json.loads(l)["custom_id"] for l in body.splitlines()] == [f"req-{i}" for i in range(40)]
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


def test_errors_go_to_their_own_url_and_a_local_output_stays_local(bucket, engine, tmp_path):
    bucket.objects["/in.jsonl"] = lines(3) + b"{not json\n"
    code, err = run_batch(
        "-i", f"{bucket.url}/in.jsonl", "-o", str(tmp_path / "out.jsonl"),
        "--errors", f"{bucket.url}/err.jsonl", "--engine-url", engine.url,
    )  # fmt: skip
    assert code == 0, err
    assert len((tmp_path / "out.jsonl").read_bytes().splitlines()) == 3
    assert [p for p, _, _ in bucket.puts] == ["/err.jsonl"]
    assert json.loads(bucket.objects["/err.jsonl"])["error"]["code"] == "invalid_json_line"


def test_transient_failures_are_retried_with_backoff(bucket, tmp_path):
    (tmp_path / "data").write_bytes(b"x" * (3 * remote_io.PUT_BLOCK_BYTES + 5))
    bucket.fail_puts = 2
    slept: list[float] = []
    remote_io.put_file(
        f"{bucket.url}/o", tmp_path / "data", retries=Retries(attempts=4, base_seconds=1), sleep=slept.append
    )
    assert slept == [1, 2] and len(bucket.puts) == 3
    assert bucket.objects["/o"] == (tmp_path / "data").read_bytes()  # each attempt sends the whole file

    bucket.objects["/in"] = b"abc\n"
    bucket.fail_gets = 1
    with remote_io.source(f"{bucket.url}/in", sleep=slept.append) as f:
        assert f.read() == b"abc\n"
    assert slept == [1, 2, 1]


def test_retries_end_and_a_refused_url_is_not_retried(bucket, tmp_path):
    (tmp_path / "data").write_bytes(b"x")
    bucket.fail_puts = 10
    slept: list[float] = []
    with pytest.raises(RemoteError, match=r"PUT .*/o failed: HTTP 503"):
        remote_io.put_file(f"{bucket.url}/o", tmp_path / "data", retries=Retries(attempts=3), sleep=slept.append)
    assert len(bucket.puts) == 3 and slept == [1, 2]

    bucket.refuse.add("/denied")
    slept.clear()
    with (
        pytest.raises(RemoteError, match=r"HTTP 403.*AccessDenied") as info,
        remote_io.source(f"{bucket.url}/denied?X-Amz-Signature=secret", sleep=slept.append),
    ):
        pass
    assert slept == [] and "secret" not in str(info.value)  # final at once; the signature not echoed


def test_a_run_that_fails_sends_nothing_and_leaves_no_temporary_file(bucket, tmp_path):
    with pytest.raises(ValueError), remote_io.sink(f"{bucket.url}/out", tmp_dir=tmp_path) as f:
        f.write(b"half a run\n")
        raise ValueError("the run broke")
    assert bucket.puts == [] and list(tmp_path.iterdir()) == []


def test_an_unreachable_or_refused_url_is_exit_code_1_with_its_reason(bucket, engine, tmp_path):
    bucket.refuse.add("/in.jsonl")
    code, err = run_batch("-i", f"{bucket.url}/in.jsonl", "-o", str(tmp_path / "o"), "--engine-url", engine.url)
    assert code == 1 and "GET" in err and "HTTP 403" in err

    bucket.objects["/in.jsonl"] = lines(2)
    bucket.refuse = {"/out.jsonl"}
    code, err = run_batch("-i", f"{bucket.url}/in.jsonl", "-o", f"{bucket.url}/out.jsonl", "--engine-url", engine.url)
    assert code == 1 and "PUT" in err and "HTTP 403" in err and "SignatureDoesNotMatch" in err


def test_local_paths_are_files(tmp_path: Path):
    assert not remote_io.is_url(str(tmp_path / "a.jsonl")) and not remote_io.is_url(tmp_path)
    assert remote_io.is_url("https://bucket.s3.amazonaws.com/k?X-Amz-Signature=s")
    with remote_io.sink(tmp_path / "a.jsonl") as f:
        f.write(b"x\n")
    with remote_io.source(tmp_path / "a.jsonl") as f:
        assert f.read() == b"x\n"
