"""Tools people already point at OpenAI's Batch API, unchanged, with only the base URL and the key
set (docs/clients.md): the official Node SDK, bespokelabs-curator's batch mode, litellm's batch
functions and the curl commands of OpenAI's Batch guide, each run as its own process against the
deployment with its models (locally: the real engines), each printing a JSON summary that these
tests assert on.

The clients are installed by `make clients` (.venv-clients for curator and litellm, whose openai
2.x pin differs from the project's; tests/clients/node/node_modules for the Node SDK): a test fails,
never skips, when its client is missing. Each test has a tenant of its own, so listings see only
its objects. Greedy text differs between runs: these tests assert structure, counts and bytes,
never text."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.target import Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "clients"
CLIENTS_PYTHON = REPO / ".venv-clients" / "bin" / "python"
NODE_CLIENT = CLIENTS / "node"
GUIDE = CLIENTS / "curl" / "guide.sh"
#: One client's whole run (its batches on the CPU engines take seconds; curator's imports ~5 s).
CLIENT_TIMEOUT = 300
TERMINAL = ("completed", "failed", "expired", "cancelled")
#: What curator and litellm need to stay off the network (docs/clients.md, "Client settings").
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "TELEMETRY_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


@pytest.fixture
def tenant_key(deployment_with_models: Deployment, request: pytest.FixtureRequest) -> str:
    """A key of a tenant of this test's own."""
    tenant = "clients-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:50]
    return deployment_with_models.new_key(tenant)


def client_env(**extra: str) -> dict[str, str]:
    """This process's environment (locally: tests/conftest.py's dead proxy for anything but
    loopback, so a client that reached for the network fails) without any OpenAI setting of the
    developer's shell, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return {**env, **extra}


def run(argv: list[str], *, env: dict[str, str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(
        argv,
        check=False,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
    )
    assert done.returncode == 0, (
        f"{what} exited {done.returncode} after {time.monotonic() - started:.1f}s\n"
        f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-8000:]}"
    )
    return done


def summary_of(done: subprocess.CompletedProcess) -> dict:
    """The JSON summary a client script prints last on stdout."""
    return json.loads(done.stdout.strip().splitlines()[-1])


def clients_python() -> str:
    if not CLIENTS_PYTHON.exists():
        pytest.fail(f"{CLIENTS_PYTHON} is missing: `make clients` installs it (tests/clients/requirements.txt)")
    return str(CLIENTS_PYTHON)


def chat_rows(prefix: str, n: int, model: str, max_tokens: int = 8) -> list[dict]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Say a word about the number {i}."}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> bytes:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(data)
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- The official Node SDK --------------------------------------------------------------------
def test_the_node_sdk(deployment_with_models: Deployment, tenant_key: str, chat_model: str, tmp_path: Path):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH (Node.js 18+ runs the openai Node SDK)")
    if not (NODE_CLIENT / "node_modules" / "openai" / "package.json").exists():
        pytest.fail(f"{NODE_CLIENT}/node_modules has no openai: `make clients` installs it (npm ci)")
    inputs = {
        "stream": write_jsonl(tmp_path / "stream.jsonl", chat_rows("stream", 4, chat_model)),
        "buffer": write_jsonl(tmp_path / "buffer.jsonl", chat_rows("buffer", 3, chat_model, max_tokens=64)),
        "upload": write_jsonl(tmp_path / "upload.jsonl", chat_rows("upload", 5, chat_model)),
    }
    done = run(
        [node, "batch_client.mjs", chat_model, str(tmp_path)],
        cwd=NODE_CLIENT,
        what="the openai Node SDK",
        env=client_env(OPENAI_BASE_URL=deployment_with_models.base_url, OPENAI_API_KEY=tenant_key),
    )
    s = summary_of(done)
    assert s["sdk_version"] == json.loads((NODE_CLIENT / "package.json").read_text())["dependencies"]["openai"]

    # Files: stored as sent, whichever way the SDK sent them; retrieve and content agree.
    for name, key in (("stream", "stream_file"), ("buffer", "buffer_file"), ("upload", "upload")):
        f = s[key]["file"] if key == "upload" else s[key]
        assert (f["object"], f["purpose"], f["status"], f["filename"]) == (
            "file",
            "batch",
            "processed",
            f"{name}.jsonl",
        ), f
        assert (
            f["bytes"] == f["retrieved_bytes"] == f["content_length"] == len(inputs[name])
            and f["retrieved_id"] == f["id"]
        )
        assert f["content_sha256"] == sha256(inputs[name]), f"{name}: the downloaded bytes are not the uploaded ones"
    upload = s["upload"]
    assert (upload["created_status"], upload["status"], len(upload["part_ids"])) == ("pending", "completed", 2)
    assert set(s["files_listed"]) == {s["stream_file"]["id"], s["buffer_file"]["id"], upload["file"]["id"]}

    # Batches: the streamed file's and the upload's file's completed, every custom_id once.
    for key, name, n in (("chat_batch", "stream", 4), ("upload_batch", "upload", 5)):
        b = s[key]
        assert b["status"] == "completed" and b["endpoint"] == "/v1/chat/completions", b
        assert b["input_file_id"] == (s["stream_file"] if name == "stream" else upload["file"])["id"]
        assert b["request_counts"] == {"completed": n, "failed": 0, "total": n} and b["error_file_id"] is None
        assert sorted(b["custom_ids"]) == sorted(f"{name}-{i}" for i in range(n)) and b["status_codes"] == [200] * n
        assert b["usage"]["input_tokens"] > 0 and 0 < b["usage"]["output_tokens"] <= 8 * n
    assert s["chat_batch"]["metadata"] == {"client": "openai-node"}
    cancel = s["cancel"]
    assert cancel["status"] in ("cancelling", "cancelled") and cancel["cancelling_at"], cancel
    assert cancel["final_status"] == "cancelled"

    # Listing one per page: three pages, newest first, the same as auto-pagination.
    created = {s["chat_batch"]["id"], s["upload_batch"]["id"], cancel["id"]}
    assert [len(p) for p in s["batch_pages"]] == [1, 1, 1]
    assert [p[0] for p in s["batch_pages"]] == s["batches_listed"] and set(s["batches_listed"]) == created
    assert s["batches_listed"][0] == cancel["id"]  # the last created

    # Delete: gone for retrieve, content and the listing; the other files (outputs too) stay.
    assert s["delete"] == {
        "id": s["buffer_file"]["id"],
        "deleted": True,
        "object": "file",
        "after": {"retrieve": 404, "content": 404},
    }
    outputs = {s["chat_batch"]["output_file_id"], s["upload_batch"]["output_file_id"]}
    assert s["buffer_file"]["id"] not in s["files_after_delete"]
    assert {s["stream_file"]["id"], upload["file"]["id"]} | outputs <= set(s["files_after_delete"])


# --- bespokelabs-curator ------------------------------------------------------------------------
def test_curator_batches_with_structured_output(
    deployment_with_models: Deployment, tenant_key: str, chat_model: str, tmp_path: Path
):
    python = clients_python()
    work = tmp_path / "curator"
    env = client_env(**OFFLINE_ENV, CURATOR_CACHE_DIR=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    done = run(
        [python, str(CLIENTS / "curator_batch.py"), deployment_with_models.base_url, tenant_key, chat_model, str(work)],
        cwd=tmp_path,
        env=env,
        what="bespokelabs-curator",
    )
    s = summary_of(done)
    assert s["curator_version"] == "0.1.31" and s["openai_version"].startswith("2.")
    # Every review came back parsed into the schema (guided decoding keeps the engine to it).
    assert sorted(r["review_id"] for r in s["rows"]) == list(range(6)), s["rows"]
    assert all(r["sentiment"] in ("positive", "negative") for r in s["rows"]), s["rows"]
    assert s["failed_requests"] == []
    # Two reviews per batch: three batches, each completed with its two lines.
    assert len(s["batches"]) == 3 and len({b["id"] for b in s["batches"]}) == 3, s["batches"]
    for b in s["batches"]:
        assert b["status"] == "completed" and b["request_counts"] == {"completed": 2, "failed": 0, "total": 2}, b
        assert b["input_file_id"] and b["output_file_id"]

    # What curator sent: response_format json_schema lines, custom_id the row index (its own files).
    requests = [
        json.loads(line) for path in sorted(work.glob("*/requests_*.jsonl")) for line in path.read_text().splitlines()
    ]
    assert len(requests) == 6 and {r["original_row_idx"] for r in requests} == set(range(6))
    assert all(r["response_format"]["properties"]["sentiment"]["enum"] == ["positive", "negative"] for r in requests)


# --- litellm ------------------------------------------------------------------------------------
def test_litellm_batch_functions_on_embeddings(
    deployment_with_models: Deployment, tenant_key: str, embed_model: str, tmp_path: Path
):
    python = clients_python()
    rows = [
        {
            "custom_id": f"emb-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": embed_model, "input": f"sentence number {i}"},
        }
        for i in range(6)
    ]
    data = write_jsonl(tmp_path / "embeddings.jsonl", rows)
    env = client_env(**OFFLINE_ENV, HF_HOME=str(tmp_path / "hf"))
    done = run(
        [
            python,
            str(CLIENTS / "litellm_batch.py"),
            deployment_with_models.base_url,
            tenant_key,
            embed_model,
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        what="litellm",
    )
    s = summary_of(done)
    assert s["litellm_version"] == "1.83.7"
    assert s["uploaded_sha256"] == sha256(data)
    assert (s["file"]["bytes"], s["file"]["purpose"], s["file"]["status"]) == (len(data), "batch", "processed")
    assert s["batch"]["endpoint"] == "/v1/embeddings" and s["batch"]["metadata"] == {"client": "litellm"}
    assert s["batch"]["created_status"] in ("validating", "in_progress")
    assert s["completed"]["status"] == "completed" and s["completed"]["error_file_id"] is None, s["completed"]
    assert s["completed"]["request_counts"] == {"completed": 6, "failed": 0, "total": 6}
    assert sorted(r["custom_id"] for r in s["results"]) == sorted(r["custom_id"] for r in rows)
    assert all(r["status_code"] == 200 and len(r["dimensions"]) == 1 and r["dimensions"][0] > 0 for r in s["results"])
    assert len({r["dimensions"][0] for r in s["results"]}) == 1
    assert s["cancel"]["status"] in ("cancelling", "cancelled") and s["cancel"]["cancelling_at"], s["cancel"]
    assert set(s["batches_listed"]) == {s["batch"]["id"], s["cancel"]["id"]}
    assert {s["file"]["id"], s["delete"]["id"], s["completed"]["output_file_id"]} <= set(s["files_listed"])
    assert s["delete"]["deleted"] is True and s["delete"]["id"] != s["file"]["id"]
    assert s["delete"]["id"] not in s["files_after_delete"] and s["file"]["id"] in s["files_after_delete"]


# --- OpenAI's Batch guide, with curl ------------------------------------------------------------
def test_the_batch_guides_curl_commands(
    deployment_with_models: Deployment, tenant_key: str, chat_model: str, tmp_path: Path
):
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not on PATH (the Batch guide's commands are curl commands)")
    env = client_env(OPENAI_BASE_URL=deployment_with_models.base_url, OPENAI_API_KEY=tenant_key)

    def guide(*args: str) -> subprocess.CompletedProcess:
        return run(["bash", str(GUIDE), *args], cwd=tmp_path, env=env, what=f"guide.sh {' '.join(args)}")

    def answer(*args: str) -> dict:
        return json.loads(guide(*args).stdout)

    # The guide's input file: its two lines, with the local model and a few tokens.
    rows = [
        {
            "custom_id": f"request-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": chat_model,
                "max_tokens": 8,
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Hello world!"},
                ],
            },
        }
        for i in (1, 2)
    ]
    data = write_jsonl(tmp_path / "batchinput.jsonl", rows)

    uploaded = answer("upload")
    assert (uploaded["object"], uploaded["purpose"], uploaded["filename"], uploaded["bytes"]) == (
        "file",
        "batch",
        "batchinput.jsonl",
        len(data),
    ), uploaded
    guide("results", uploaded["id"])  # any file's content, the guide's redirect into batch_output.jsonl
    assert (tmp_path / "batch_output.jsonl").read_bytes() == data

    batch = answer("create", uploaded["id"])
    assert (batch["object"], batch["endpoint"], batch["input_file_id"], batch["completion_window"]) == (
        "batch",
        "/v1/chat/completions",
        uploaded["id"],
        "24h",
    ), batch
    deadline = time.monotonic() + 240
    while batch["status"] not in TERMINAL:
        assert time.monotonic() < deadline, f"batch {batch['id']} still {batch['status']}"
        time.sleep(0.5)
        batch = answer("retrieve", batch["id"])
    assert batch["status"] == "completed" and batch["request_counts"] == {"completed": 2, "failed": 0, "total": 2}, (
        batch
    )

    # The output with no -L: the answer's body is the file's bytes.
    output_path = tmp_path / "batch_output.jsonl"
    guide("results", batch["output_file_id"])
    output = output_path.read_bytes()
    assert output, "curl wrote nothing: the content route did not answer curl's Accept: */* with the bytes"
    results = [json.loads(line) for line in output.splitlines()]
    assert sorted(r["custom_id"] for r in results) == ["request-1", "request-2"]
    assert all(
        r["response"]["status_code"] == 200 and r["response"]["body"]["object"] == "chat.completion" for r in results
    )

    second = answer("create", uploaded["id"])
    cancelled = answer("cancel", second["id"])
    assert (
        cancelled["id"] == second["id"]
        and cancelled["status"] in ("cancelling", "cancelled")
        and cancelled["cancelling_at"]
    ), cancelled

    listed = answer("list")
    assert listed["object"] == "list" and listed["has_more"] is False, listed
    assert [b["id"] for b in listed["data"]] == [second["id"], batch["id"]]  # newest first
    assert listed["first_id"] == second["id"] and listed["last_id"] == batch["id"]
