"""Prompt and output policies (``functions.core.guard``) at each seam: every detector relied on
finds its secret (refuse names the type, never the secret; redact removes all of it), ordinary
prompts are never flagged, deny patterns and pluggable checks block a result, the policy travels
from the tenant's record through ingest's manifest into every work message (and a redelivered
one), the worker applies it around the engine (which never sees a refused or redacted secret),
``batchctl tenants`` and ``batchctl run-batch`` set and apply the same policy."""

import asyncio
import base64
import io
import json
import subprocess
import sys

import pytest

from batchctl import batches as batchctl_batches
from batchctl import cli
from batchctl import tenants as tenants_cli
from functions.core import guard, schema
from functions.core.guard import OUTPUT_BLOCKED, PROMPT_SECRET_DETECTED, GuardPolicy
from functions.core.messages import ChunkManifest, WorkMessage
from functions.core.tenants import TenantPolicy
from functions.ingest import logic as ingest_logic
from gpu_worker import offline
from tests.builders import batch_record, running_batch, work_message
from tests.chunks import part_bytes, process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer
from tests.unit.test_tenants import SETTINGS
from tests.unit.test_worker_loop import CHAT, NOW


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


# Secrets are assembled from pieces so this file itself holds none a scanner would flag.
PEM_BODY = "MIIEowIBAAKCAQEA7bq" + "x" * 60 + "\nAbCdEf0123456789+/=="
SECRETS = {
    "AWS access key id": ("AWS Access Key", "AKIA" + "IOSFODNN7EXAMPLE"),
    "AWS secret key (assignment)": (
        "AWS Access Key",
        'aws_secret_access_key = "' + "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + 'EXAMPLEKEY"',
    ),
    "RSA private key": (
        "Private Key",
        "-----BEGIN RSA " + f"PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
    ),
    "OpenSSH private key": (
        "Private Key",
        "-----BEGIN OPENSSH " + f"PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----",
    ),
    "GitHub token": ("GitHub Token", "ghp_" + "A1b2C3d4E5f6G7h8I9j0" + "K1l2M3n4O5p6Q7r8"),
    "GitLab token": ("GitLab Token", "glpat-" + "Ab3dEf6hIj9lMn2pQr5t"),
    "Slack token": ("Slack Token", "xoxb-" + "123456789012-1234567890123-" + "abcdefghijklmnop1234"),
    "Slack webhook": (
        "Slack Token",
        "https://hooks.slack.com/services/" + "T0123ABCD/B0123ABCD/abcdEFGHijklMNOPqrstUVWX",
    ),
    "Stripe key": ("Stripe Access Key", "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"),
    "JWT": (
        "JSON Web Token",
        f"eyJ{b64({'alg': 'HS256', 'typ': 'JWT'})[3:]}.{b64({'sub': '1234567890', 'name': 'Ann'})}."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ),
    "OpenAI key": ("OpenAI Token", "sk-" + "proj-" + "A" * 20 + "T3Blbk" + "FJ" + "B" * 20),
    "SendGrid key": ("SendGrid API Key", "SG." + "a" * 22 + "." + "b" * 43),
    "Twilio key": ("Twilio API Key", "AC" + "0123456789abcdef" * 2),
    "Basic auth URL": ("Basic Auth Credentials", "https://deploy:" + "s3cretPassw0rd" + "@registry.example.com/v2/"),
    "Telegram bot token": ("Telegram Bot Token", "110201543:" + "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawX"),
}

#: Ordinary chat prompts, code and data included: none holds a secret.
NORMAL_PROMPTS = [
    "Can you help me write a Python function that reverses a string?",
    "Explain the password reset flow of a typical web app, step by step.",
    "My password is too short, what makes a strong password?",
    "Summarize this article in three bullet points: The quick brown fox jumps over the lazy dog.",
    "What does HTTP status 429 mean and how should a client back off?",
    "Translate to French: 'The meeting is moved to Thursday at 3 pm.'",
    "Write a haiku about autumn leaves and a quiet river.",
    "def login(user, password):\n    token = make_token(user)\n    return {'token': token}\n\nWhat is wrong here?",
    "Why does `git log 3f786850e387550fdab836ed7e6dc881de23001b` show nothing?",
    "Parse this UUID: 123e4567-e89b-12d3-a456-426614174000 and tell me its version.",
    "My server at 192.168.1.20 cannot reach 10.0.0.1; what could block it?",
    "Is https://docs.python.org/3/library/re.html the right page for lookbehind?",
    "Email me at jane.doe@example.com once the report is ready.",
    "The sha256 of the file is e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855; is it empty?",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY name LIMIT 10;",
    "Traceback (most recent call last):\n  File \"app.py\", line 3, in <module>\nKeyError: 'api_key'",
    "Convert 72 degrees Fahrenheit to Celsius and show the formula.",
    "In Kubernetes, what is the difference between a Secret and a ConfigMap?",
    "Set AWS_REGION=us-east-1 and AWS_PROFILE=dev, then run `aws s3 ls`; what happens?",
    "How do I rotate an AWS access key safely without downtime?",
    "Describe the APACHE LICENSE 2.0 in plain words. APPROVED by legal?",
    "A base64 string: SGVsbG8sIFdvcmxkIQ== decodes to what?",
    "What is 2^64 - 1? Write it in hex: 0xFFFFFFFFFFFFFFFF.",
    "Generate a JSON object with keys name, age, city for a fictional person.",
    "Write a regex that matches ISO dates like 2025-12-31T23:59:59Z.",
    "The config says timeout=30 and retries=5; is that sensible for an API client?",
    "List five tips to improve sleep quality.",
    "What is the time complexity of quicksort in the worst case?",
    "Call me at +1 (555) 123-4567 tomorrow morning.",
    "Our order number is 4000-1234-5678-9010; when will it ship?",
    "Rewrite this sentence to be more formal: gonna need that doc asap.",
    "What's the capital of Australia, and why isn't it Sydney?",
    "Docker image tag: myrepo/app:1.4.2-alpine@sha256:9b2a4c0d1e; how do I pin it?",
    "Here is a CSV row: 42,Alice,alice@example.org,2024-05-06,true. Convert to JSON.",
    "Explain JWTs: header, payload and signature, without using real tokens.",
    "Why does `ssh-keygen -t ed25519` ask for a passphrase?",
    "The GitHub issue #1234 mentions ghp tokens being revoked; what does that mean?",
    "My Slack channel is #team-infra; how do I set a reminder there?",
    "Explain what sk_test keys are in Stripe's documentation, in general terms.",
    "Write a limerick about a cat who learned to code in Rust.",
]


def chat_body(text: str) -> dict:
    return {
        "model": "test-chat",
        "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": text}],
    }


# --- detectors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SECRETS))
def test_refuse_names_the_type_never_the_secret(name):
    kind, secret = SECRETS[name]
    body = chat_body(f"Please debug this, it fails:\n{secret}\nThanks!")
    same, violation = GuardPolicy(prompt_secrets="refuse").check_prompt(body)
    assert violation is not None and violation.code == PROMPT_SECRET_DETECTED
    assert kind in violation.message and secret not in violation.message
    assert same is body


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_redact_replaces_the_whole_secret_with_its_type(name):
    kind, secret = SECRETS[name]
    body = chat_body(f"Please debug this, it fails:\n{secret}\nThanks!")
    redacted, violation = GuardPolicy(prompt_secrets="redact").check_prompt(body)
    text = redacted["messages"][1]["content"]
    assert violation is None
    assert f"[REDACTED:{kind}]" in text and text.startswith("Please debug this") and text.endswith("Thanks!")
    # No piece of the secret's value survives (its variable end; a URL's password).
    tail = "s3cretPassw0rd" if kind == "Basic Auth Credentials" else secret[-12:]
    assert tail not in text and secret not in text
    assert (
        body["messages"][1]["content"].endswith("Thanks!") and secret in body["messages"][1]["content"]
    )  # input unchanged


def test_every_string_of_the_body_is_scanned_not_only_messages():
    key = SECRETS["AWS access key id"][1]
    for body in (
        {"model": "m", "prompt": f"key {key}"},
        {"model": "m", "input": ["fine", f"x {key}"]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": key}]}]},
        {"model": "m", "messages": [], "metadata": {"deep": [[{"note": key}]]}},
    ):
        _, violation = GuardPolicy(prompt_secrets="refuse").check_prompt(body)
        assert violation is not None, body
        redacted, _ = GuardPolicy(prompt_secrets="redact").check_prompt(body)
        assert key not in json.dumps(redacted)


def test_several_secrets_of_several_types_in_one_string():
    aws, gh = SECRETS["AWS access key id"][1], SECRETS["GitHub token"][1]
    body = chat_body(f"a {aws} b {gh} c {aws}")
    _, violation = GuardPolicy(prompt_secrets="refuse").check_prompt(body)
    assert "AWS Access Key, GitHub Token" in violation.message
    redacted, _ = GuardPolicy(prompt_secrets="redact").check_prompt(body)
    assert (
        redacted["messages"][1]["content"]
        == "a [REDACTED:AWS Access Key] b [REDACTED:GitHub Token] c [REDACTED:AWS Access Key]"
    )


def test_no_false_positive_on_ordinary_prompts():
    flagged = [p for p in NORMAL_PROMPTS if guard.find_secrets(p)]
    assert flagged == []
    policy = GuardPolicy(prompt_secrets="refuse")
    for prompt in NORMAL_PROMPTS:
        body = chat_body(prompt)
        assert policy.check_prompt(body) == (body, None)
        assert GuardPolicy(prompt_secrets="redact").check_prompt(body)[0] == body


def test_off_checks_nothing():
    body = chat_body(SECRETS["AWS access key id"][1])
    assert GuardPolicy().check_prompt(body) == (body, None)
    assert not GuardPolicy().active and guard.active(GuardPolicy()) is None and guard.active(None) is None
    assert guard.active(GuardPolicy(prompt_secrets="redact")) == GuardPolicy(prompt_secrets="redact")


# --- output --------------------------------------------------------------------------------------
def answer(text: str) -> dict:
    return chat_answer({"model": "test-chat", "messages": [{"role": "user", "content": text}]})


def block_word(body):
    """A pluggable check for the tests: blocks results mentioning 'forbidden'."""
    return "it mentions forbidden" if "forbidden" in json.dumps(body) else None


def broken_check(body):
    raise RuntimeError("the check's backend is down")


def test_a_deny_pattern_blocks_a_result_whose_generated_text_matches():
    policy = GuardPolicy(output_deny_patterns=[r"(?i)\bconfidential\b", r"\d{3}-\d{2}-\d{4}"])
    assert policy.check_output(answer("hello")) is None
    violation = policy.check_output(answer("This is CONFIDENTIAL"))
    assert violation.code == OUTPUT_BLOCKED and "deny pattern 1" in violation.message
    assert policy.check_output(answer("ssn 123-45-6789")).message.endswith("(deny pattern 2).")
    # Only generated text counts: the envelope's strings (id, object, model) are not matched.
    assert GuardPolicy(output_deny_patterns=["chat.completion", "test-chat"]).check_output(answer("hi")) is None
    completion = {"object": "text_completion", "choices": [{"text": "a confidential plan"}]}
    tool = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": '{"x": "confidential"}'}}],
                }
            }
        ]
    }
    responses = {
        "object": "response",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "confidential"}]}],
    }
    for body in (completion, tool, responses):
        assert policy.check_output(body) is not None, body


def test_a_pluggable_check_blocks_with_its_reason_and_fails_closed():
    policy = GuardPolicy(output_checks=["tests.unit.test_guard:block_word"])
    assert policy.check_output(answer("fine")) is None
    violation = policy.check_output(answer("something forbidden"))
    assert violation.code == OUTPUT_BLOCKED and violation.message.endswith("it mentions forbidden")
    for name in ("tests.unit.test_guard:broken_check", "tests.unit.test_guard:no_such_check", "no_such_module:check"):
        violation = GuardPolicy(output_checks=[name]).check_output(answer("fine"))
        assert violation.code == OUTPUT_BLOCKED and "could not run" in violation.message, name


def test_the_example_check_blocks_a_secret_in_the_output():
    policy = GuardPolicy(output_checks=["functions.core.guard:output_secrets"])
    assert policy.check_output(answer("no secrets here")) is None
    violation = policy.check_output(answer(f"the key is {SECRETS['GitHub token'][1]}"))
    assert "GitHub Token" in violation.message and SECRETS["GitHub token"][1] not in violation.message


def test_the_policy_is_validated_when_set():
    for bad in (
        {"output_deny_patterns": [""]},
        {"output_checks": ["not a name"]},
        {"output_checks": ["module_without_function"]},
        {"prompt_secrets": "block"},
        {"output_deny_patterns": ["x"] * 33},
        {"output_deny_patterns": ["x" * 513]},
        {"other": 1},
    ):
        with pytest.raises(ValueError):
            GuardPolicy(**bad)
    # Compiling a pattern is RE2's work, done where the policy is set (batchctl) and used (the
    # worker), never where the Lambdas read it.
    with pytest.raises(ValueError, match="output deny pattern 2: not a valid RE2 regular expression"):
        GuardPolicy(output_deny_patterns=["fine", "("]).compiled()


# --- the policy travels: tenant record -> manifest -> work messages ------------------------------
POLICY = GuardPolicy(
    prompt_secrets="refuse", output_deny_patterns=["never"], output_checks=["tests.unit.test_guard:block_word"]
)


def test_the_tenant_record_holds_the_policy_and_old_records_still_parse():
    policy = TenantPolicy(tenant="acme", guard=POLICY)
    assert TenantPolicy.from_item(policy.to_item()) == policy
    old = TenantPolicy(tenant="acme").to_item()
    assert "guard" not in old and TenantPolicy.from_item(old).guard is None


def ingest(stores, lines: int = 3):
    content = "".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": {"model": "m", "messages": []}}) + "\n"
        for i in range(lines)
    ).encode()
    record = batch_record(created_at=NOW)
    stores.batches.put(record)
    stores.objects.put(record.input_key, content)
    ingest_logic.ingest(stores, SETTINGS, "acme", "batch_1", now=NOW)
    return [WorkMessage.model_validate_json(b) for b in stores.queues.queue("q-m").bodies()]


def test_ingest_snapshots_the_policy_into_the_manifest_and_every_work_message():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", guard=POLICY))
    messages = ingest(stores)
    assert messages and all(m.guard == POLICY for m in messages)
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1")))
    assert manifest.guard == POLICY
    # A later change of the tenant's policy does not change this batch's: a retried fan-out (the
    # ingest DLQ, the sweeper) re-reads the manifest, not the tenant record.
    stores.tenants.put(TenantPolicy(tenant="acme"))
    stores.batches.set("acme", "batch_1", enqueued=False)
    batch = stores.batches.get("acme", "batch_1")
    ingest_logic.resume(stores, SETTINGS, batch, NOW)
    again = [WorkMessage.model_validate_json(b) for b in stores.queues.queue("q-m").bodies()][len(messages) :]
    assert again and all(m.guard == POLICY for m in again)


@pytest.mark.parametrize("policy", [None, TenantPolicy(tenant="acme", guard=GuardPolicy())])
def test_without_an_active_policy_messages_are_as_before(policy):
    stores = fake_stores()
    if policy is not None:
        stores.tenants.put(policy)
    ingest(stores)
    bodies = stores.queues.queue("q-m").bodies()
    assert bodies and all("guard" not in json.loads(b) for b in bodies)
    old = json.loads(bodies[0])
    assert WorkMessage.model_validate(old).guard is None  # a message from before policies parses


# --- the worker applies it around the engine -------------------------------------------------------
def seed(stores, texts: list[str], policy: GuardPolicy | None) -> WorkMessage:
    lines = [
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": chat_body(t)}) + "\n"
        for i, t in enumerate(texts)
    ]
    key = schema.batch_input_key("acme", "batch_1")
    data = "".join(lines).encode()
    stores.objects.put(key, data)
    batch = running_batch(created_at=NOW, total=len(lines), model="test-chat")
    stores.batches.put(batch)
    message = work_message(batch, byte_end=len(data), line_count=len(lines), guard=policy)
    return WorkMessage.model_validate_json(message.model_dump_json())  # as SQS delivers it (None fields kept)


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def run(stores, message, engine):
    return asyncio.run(process_chunk(stores, message, engine, io=direct, max_line_bytes=1 << 20, now=lambda: 1000))


def counted(stores) -> dict[str, list[dict]]:
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    return {
        kind: [
            json.loads(x) for x in part_bytes(stores.objects, "acme", "batch_1", 0, marker.attempt, kind).splitlines()
        ]
        for kind in ("out", "err")
    }


def test_refuse_in_the_worker_never_sends_the_secret_to_the_engine():
    secret = SECRETS["AWS access key id"][1]
    stores = fake_stores()
    message = seed(stores, ["hello", f"my key is {secret}", "bye"], GuardPolicy(prompt_secrets="refuse"))
    engine = InProcessEngine()
    report = run(stores, message, engine)
    assert (report.completed, report.failed) == (2, 1)
    assert secret not in json.dumps(engine.requests) and len(engine.requests) == 2
    parts = counted(stores)
    assert [(e["custom_id"], e["error"]["code"]) for e in parts["err"]] == [("req-1", PROMPT_SECRET_DETECTED)]
    assert secret not in json.dumps(parts)
    assert [o["custom_id"] for o in parts["out"]] == ["req-0", "req-2"]


def test_redact_in_the_worker_sends_the_redacted_body():
    secret = SECRETS["Stripe key"][1]
    stores = fake_stores()
    message = seed(stores, [f"charge with {secret} please"], GuardPolicy(prompt_secrets="redact"))
    engine = InProcessEngine()
    report = run(stores, message, engine)
    assert (report.completed, report.failed) == (1, 0)
    assert engine.contents() == ["charge with [REDACTED:Stripe Access Key] please"]


def test_an_output_blocked_in_the_worker_is_an_error_line_without_the_result():
    stores = fake_stores()
    message = seed(
        stores,
        ["say something forbidden", "say hi", "say never"],
        GuardPolicy(output_deny_patterns=["never"], output_checks=["tests.unit.test_guard:block_word"]),
    )
    report = run(stores, message, InProcessEngine())
    assert (report.completed, report.failed) == (1, 2)
    parts = counted(stores)
    assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in parts["err"]] == [
        ("req-0", OUTPUT_BLOCKED, None),
        ("req-2", OUTPUT_BLOCKED, None),
    ]
    assert "forbidden" not in json.dumps(parts["err"]) or "echo" not in json.dumps(parts["err"])
    assert "echo say" not in json.dumps(parts["err"])  # the blocked answers' text is written nowhere
    assert report.usage.output_tokens == 3  # only the written result's usage counts


@pytest.mark.parametrize("fault", ["objects.get", "objects.put"])
def test_a_redelivered_message_applies_the_same_policy(fault):
    """The first attempt dies before running (reading the chunk) or while committing (its results
    are kept as a checkpoint); SQS redelivers the same body: the policy rides in it, so the retry
    runs (or reuses) the lines under it and the engine never sees the secret."""
    secret = SECRETS["GitHub token"][1]
    stores = fake_stores()
    message = seed(stores, ["one", f"token {secret}", "three"], GuardPolicy(prompt_secrets="refuse"))
    body = message.model_dump_json()
    engine = InProcessEngine()
    stores.faults.fail(fault, RuntimeError("S3 is down"))
    with pytest.raises(RuntimeError):
        run(stores, message, engine)
    redelivered = WorkMessage.model_validate_json(body)
    assert redelivered.guard == GuardPolicy(prompt_secrets="refuse")
    report = run(stores, redelivered, engine)
    assert (report.completed, report.failed, report.reused) == (2, 1, 3 if fault == "objects.put" else 0)
    assert len(engine.requests) == 2
    assert secret not in json.dumps(engine.requests)
    assert [e["error"]["code"] for e in counted(stores)["err"]] == [PROMPT_SECRET_DETECTED]


# --- batchctl -------------------------------------------------------------------------------------
def tenants_cmd(repo, *argv):
    args = cli.parser().parse_args(["tenants", *argv])
    out, err = io.StringIO(), io.StringIO()
    return tenants_cli.run(args, repo, now=NOW, out=out, err=err), out.getvalue(), err.getvalue()


def test_batchctl_tenants_sets_and_clears_the_policy():
    repo = fake_stores().tenants
    code, out, err = tenants_cmd(
        repo,
        "create",
        "--tenant",
        "acme",
        "--prompt-secrets",
        "redact",
        "--output-deny",
        "secret plan",
        "--output-deny",
        r"\d{16}",
    )
    assert code == 0, err
    assert repo.get("acme").guard == GuardPolicy(
        prompt_secrets="redact", output_deny_patterns=["secret plan", r"\d{16}"]
    )
    assert json.loads(out)["guard"]["prompt_secrets"] == "redact"
    code, _, err = tenants_cmd(repo, "set", "--tenant", "acme", "--output-check", "functions.core.guard:output_secrets")
    assert code == 0, err
    assert repo.get("acme").guard == GuardPolicy(
        prompt_secrets="redact",
        output_deny_patterns=["secret plan", r"\d{16}"],
        output_checks=["functions.core.guard:output_secrets"],
    )
    code, _, err = tenants_cmd(repo, "set", "--tenant", "acme", "--output-deny", "none", "--batches-per-hour", "3")
    assert code == 0, err
    stored = repo.get("acme")
    assert (
        stored.guard.output_deny_patterns == []
        and stored.guard.prompt_secrets == "redact"
        and stored.batches_per_hour == 3
    )


@pytest.mark.parametrize("pattern", [r"(a)\1", r"secret(?=s)", r"(?<!no )secret", r"(?>atomic)", r"x{2000}"])
def test_batchctl_refuses_a_pattern_re2_cannot_run_with_a_clear_message(pattern, capsys):
    """Backreferences, lookarounds, atomic groups, huge repeats: no linear-time engine runs them."""
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["tenants", "set", "--tenant", "acme", "--output-deny", pattern])
    assert exit_.value.code == 2
    assert "not a valid RE2 regular expression" in capsys.readouterr().err


def test_a_stored_pattern_re2_cannot_run_fails_closed_and_blocks_the_next_set():
    """A pattern stored before deny patterns ran in RE2: every 2xx result is blocked (the pattern
    cannot run), and a change of the tenant's guard options is refused until it is replaced."""
    repo = fake_stores().tenants
    stored = GuardPolicy(output_deny_patterns=["fine", r"(a)\1"])  # what the Lambdas read: no compile there
    repo.put(TenantPolicy(tenant="acme", guard=stored))
    violation = stored.check_output(answer("hello"))
    assert (
        violation.code == OUTPUT_BLOCKED
        and "deny pattern 2" in violation.message
        and "cannot be run" in violation.message
    )
    code, _, err = tenants_cmd(repo, "set", "--tenant", "acme", "--prompt-secrets", "refuse")
    assert code == 2 and "output deny pattern 2: not a valid RE2 regular expression" in err
    assert repo.get("acme").guard == stored
    code, _, err = tenants_cmd(repo, "set", "--tenant", "acme", "--output-deny", "fine", "--prompt-secrets", "refuse")
    assert code == 0, err
    assert repo.get("acme").guard == GuardPolicy(prompt_secrets="refuse", output_deny_patterns=["fine"])


def test_deny_patterns_run_in_re2_syntax():
    policy = GuardPolicy(output_deny_patterns=[r"\pL+ falcon", r"(?i)project\s+x"]).compiled()
    assert policy.check_output(answer("Operation falcon")) is not None
    assert policy.check_output(answer("PROJECT   X")) is not None
    assert policy.check_output(answer("nothing here")) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--output-deny", "("],
        ["--output-check", "no_module_here:f"],
        ["--output-check", "bad name"],
        ["--prompt-secrets", "maybe"],
    ],
)
def test_batchctl_refuses_a_bad_policy_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["tenants", "set", "--tenant", "acme", *argv])
    assert exit_.value.code == 2


@pytest.mark.parametrize("code", [PROMPT_SECRET_DETECTED, OUTPUT_BLOCKED])
def test_batchctl_retry_does_not_retry_a_policy_refusal_by_default(code):
    """The same request fails the same way under the same policy: ``rejected``, which ``batches
    retry`` takes only with ``--only all`` (the retry is a new batch: the policy applies again)."""
    line = {"custom_id": "a", "response": None, "error": {"code": code, "message": "m"}}
    assert batchctl_batches.retry_class(line) == "rejected"


def test_run_batch_applies_the_same_policy():
    secret = SECRETS["AWS access key id"][1]
    lines = [
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": chat_body(t)})
        for i, t in enumerate(["hi", f"key {secret}", "a forbidden word"])
    ]
    args = cli.parser().parse_args(
        [
            "run-batch",
            "-i",
            "in",
            "-o",
            "out",
            "--engine-url",
            "http://x",
            "--prompt-secrets",
            "refuse",
            "--output-check",
            "tests.unit.test_guard:block_word",
        ]
    )
    policy = guard.from_arguments(args)
    engine = InProcessEngine()
    output = io.BytesIO()
    summary = asyncio.run(offline.run_file(engine, io.BytesIO("\n".join(lines).encode()), output, guard=policy))
    assert (summary.completed, summary.failed) == (1, 2)
    results = [json.loads(x) for x in output.getvalue().splitlines()]
    assert [(r["custom_id"], r["error"] and r["error"]["code"]) for r in results] == [
        ("r0", None),
        ("r1", PROMPT_SECRET_DETECTED),
        ("r2", OUTPUT_BLOCKED),
    ]
    assert secret not in json.dumps(engine.requests)
    no_flags = cli.parser().parse_args(["run-batch", "-i", "in", "-o", "out", "--engine-url", "http://x"])
    assert guard.from_arguments(no_flags) is None


def test_the_lambdas_import_the_policy_without_detect_secrets():
    """Ingest and the API import ``GuardPolicy`` (tenant record, messages) and validate a stored
    one, but never scan nor compile a pattern: detect-secrets and RE2 are worker (and batchctl)
    dependencies, loaded on first use only, so the Lambda asset holds neither."""
    code = (
        "import sys, functions.ingest.logic, functions.api.batches, functions.core.guard, functions.core.tenants; "
        "from functions.core.tenants import TenantPolicy; "
        "TenantPolicy.from_item(TenantPolicy(tenant='a', guard={'output_deny_patterns': ['x']}).to_item()); "
        "assert 'detect_secrets' not in sys.modules and 're2' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
