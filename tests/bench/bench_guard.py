"""What the prompt and output policies (``functions.core.guard``) cost per line, on this machine's
CPU: the worker scans every request body before the engine and every 2xx result after it.

2,000 chat request lines (seeded: a system prompt, then 1-8 ordinary prompts, prose and code,
from tests/unit/test_guard's NORMAL_PROMPTS, some with a code block: 150 to 3,000 characters),
a tenth of them carrying one secret (each type of tests/unit/test_guard's SECRETS in turn). Timed:
``check_prompt`` (refuse and redact) on the clean and on the secret lines, ``check_output`` with
two deny patterns and with the example check (``output_secrets``) on a chat answer of the line's
size, and ``json.loads`` of the line for scale. Each figure is the best of ``--rounds`` rounds'
mean CPU microseconds per line (the process's CPU time, ``time.process_time``: what the scan costs
a core, not inflated by other processes competing for the CPU).

    .venv/bin/python -m tests.bench.bench_guard [--lines 2000] [--rounds 3]
    .venv/bin/python -m tests.bench.bench_guard --per-mib [--mib 1]

``--per-mib``: the prompt scan's CPU cost per MiB of one string, for ordinary prose and for the
adversarial shapes (a short pattern repeated: those on which the plugins' regexes were quadratic on
Python's ``re``, those with a finding every few characters, those the normalization works hardest
on), ``check_prompt`` in refuse and in redact mode on a chat body holding it; beside it, the
plugins on Python's ``re`` (``tests/unit/secret_oracle``, the scan before RE2) on 16 and 32 KiB of
the same shape, to show how that grew (doubling the input quadrupled it where it was quadratic).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from functions.core.guard import GuardPolicy, find_secrets
from tests.unit import secret_oracle
from tests.unit.test_guard import NORMAL_PROMPTS, SECRETS

#: The shapes of ``--per-mib``: (name, the repeated piece).
SHAPES = (
    ("ordinary prose", "The quick brown fox jumps over the lazy dog; what does it mean? "),
    ("'//' repeated (NPM's //.+)", "//"),
    ("'see http://x ' repeated", "see http://x "),
    ("'sk-' repeated (OpenAI's sk-[...]*)", "sk-"),
    ("'eyJ' repeated (JWT's eyJ[...]+)", "eyJ"),
    ("'://a' repeated (basic auth)", "://a"),
    ("'glagent-' repeated (GitLab, on Python re)", "glagent-"),
    ("'BEGIN RSA PRIVATE KEY' repeated", "BEGIN RSA PRIVATE KEY"),
    ("AWS keys, one every 21 characters", SECRETS["AWS access key id"][1] + " "),
    ("'xoxb-1-' repeated (one Slack token)", "xoxb-1-"),
    ("'A' + zero-width space, repeated", "A\u200b"),
    ("'a' + two combining marks, repeated", "a\u0316\u0301"),
    ("U+FDFA repeated (NFKD: 18 characters each)", "\ufdfa"),
)

CODE = """```python
def fetch(url: str, retries: int = 3) -> bytes:
    for attempt in range(retries):
        try:
            return http.get(url, timeout=10).content
        except TimeoutError:
            time.sleep(2 ** attempt)
    raise RuntimeError(f"gave up on {url}")
```"""


def make_lines(n: int, *, seed: int = 13) -> list[tuple[str, dict[str, Any], bool]]:
    """(line, body, has_secret) for ``n`` chat request lines."""
    rng = random.Random(seed)
    secrets = [s for _, s in SECRETS.values()]
    out = []
    for i in range(n):
        parts = rng.sample(NORMAL_PROMPTS, rng.randint(1, 8))
        if rng.random() < 0.3:
            parts.insert(rng.randrange(len(parts) + 1), CODE)
        has_secret = i % 10 == 0
        if has_secret:
            parts.insert(rng.randrange(len(parts) + 1), f"This fails with {secrets[(i // 10) % len(secrets)]} set.")
        body = {
            "model": "chat-model",
            "max_tokens": 256,
            "messages": [
                {"role": "system", "content": "You are a careful assistant. Answer briefly and precisely."},
                {"role": "user", "content": "\n\n".join(parts)},
            ],
        }
        line = json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        out.append((line, body, has_secret))
    return out


def answer_of(body: dict[str, Any]) -> dict[str, Any]:
    text = body["messages"][-1]["content"]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "chat-model",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"Sure. {text}"}}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 100, "total_tokens": 200},
    }


def per_line_us(items: list[Any], fn: Callable[[Any], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for item in items:
            fn(item)
        best = min(best, (time.process_time() - started) / len(items) * 1e6)
    return best


def cpu_seconds(fn: Callable[[], Any]) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def per_mib(mib: float) -> None:
    find_secrets("warm up")
    refuse, redact = GuardPolicy(prompt_secrets="refuse"), GuardPolicy(prompt_secrets="redact")
    size = int(mib * 1024 * 1024)
    print(
        f"CPU ms per MiB of one string ({mib:g} MiB of UTF-8 each), check_prompt on a chat body holding it; "
        "the plugins on Python's re (before RE2) on 16 and 32 KiB"
    )
    print("| input | refuse, ms/MiB | redact, ms/MiB | Python re, 16 KiB | Python re, 32 KiB |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, piece in SHAPES:
        text = piece * (size // len(piece.encode()))
        actual = len(text.encode()) / (1024 * 1024)
        body = {"model": "m", "messages": [{"role": "user", "content": text}]}
        row = [
            cpu_seconds(lambda: refuse.check_prompt(body)) * 1000 / actual,
            cpu_seconds(lambda: redact.check_prompt(body)) * 1000 / actual,
        ]
        old = [
            cpu_seconds(lambda n=n: secret_oracle.find_secrets(piece * (n // len(piece.encode())))) * 1000
            for n in (16 * 1024, 32 * 1024)
        ]
        print(f"| {name} | {row[0]:.0f} | {row[1]:.0f} | {old[0]:.0f} ms | {old[1]:.0f} ms |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-mib", action="store_true", help="the scan's cost per MiB, ordinary and adversarial")
    p.add_argument("--mib", type=float, default=1.0)
    args = p.parse_args()
    if args.per_mib:
        per_mib(args.mib)
        return
    lines = make_lines(args.lines)
    clean = [b for _, b, s in lines if not s]
    dirty = [b for _, b, s in lines if s]
    # Sanity: the detector agrees with the generator (no false positive, no miss).
    assert not any(find_secrets(b["messages"][-1]["content"]) for b in clean), "a clean line was flagged"
    assert all(find_secrets(b["messages"][-1]["content"]) for b in dirty), "a secret was missed"
    find_secrets("warm up")  # the detectors' import and construction are not per line

    refuse, redact = GuardPolicy(prompt_secrets="refuse"), GuardPolicy(prompt_secrets="redact")
    deny = GuardPolicy(output_deny_patterns=[r"(?i)\bconfidential\b", r"\b\d{3}-\d{2}-\d{4}\b"])
    check = GuardPolicy(output_checks=["functions.core.guard:output_secrets"])
    answers = [answer_of(b) for b in clean]
    chars = [len(line) for line, _, _ in lines]
    rows = [
        ("json.loads of the line (scale)", per_line_us([line for line, _, _ in lines], json.loads, args.rounds)),
        ("check_prompt refuse, clean line", per_line_us(clean, refuse.check_prompt, args.rounds)),
        ("check_prompt refuse, line with a secret", per_line_us(dirty, refuse.check_prompt, args.rounds)),
        ("check_prompt redact, clean line", per_line_us(clean, redact.check_prompt, args.rounds)),
        ("check_prompt redact, line with a secret", per_line_us(dirty, redact.check_prompt, args.rounds)),
        ("check_output, 2 deny patterns", per_line_us(answers, deny.check_output, args.rounds)),
        ("check_output, example check output_secrets", per_line_us(answers, check.check_output, args.rounds)),
    ]
    print(
        f"{len(lines)} lines ({len(clean)} clean, {len(dirty)} with a secret); line length: median "
        f"{statistics.median(chars):.0f}, mean {statistics.fmean(chars):.0f}, max {max(chars)} characters; "
        f"best of {args.rounds} rounds"
    )
    for name, us in rows:
        print(f"  {name:<44} {us:8.1f} CPU us/line")


if __name__ == "__main__":
    main()
