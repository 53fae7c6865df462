"""Prompt and output policies (issue 13, item 3): the ONE implementation, used by ingest (which
snapshots a tenant's policy into every work message of a batch), by the GPU worker (every line,
retries and redeliveries included, since the policy travels in the message) and by the offline
``batchctl run-batch``. docs/governance.md, "Prompt and output policies".

- **Prompt**: every string value of a request's ``body`` is scanned for secrets with the plugins of
  `detect-secrets <https://github.com/Yelp/detect-secrets>`_ (``SECRET_DETECTORS``: cloud keys,
  private keys, vendor tokens; the high-entropy and keyword detectors are off, they flag ordinary
  prose and code samples). ``refuse``: the line becomes an error line ``prompt_secret_detected``
  (the message names the secret's type, never the secret) and is not sent to the engine;
  ``redact``: each secret is replaced by ``[REDACTED:<type>]`` and the redacted body is sent.
- **Output**: a 2xx result's generated text (``GENERATED_TEXT_KEYS``) is matched against the
  policy's deny patterns (Python regexes, validated when set), then the result body is given to
  each pluggable check (``module:function`` taking the body, returning None or a reason). A match,
  a reason, or a check that cannot run (fail closed) turns the line into an error line
  ``output_blocked``; the result body is not written.

detect-secrets is imported on first use (it is a worker dependency; the Lambdas import this module
for ``GuardPolicy`` only)."""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import limits

#: Error codes of the lines the policy turns into errors.
PROMPT_SECRET_DETECTED = "prompt_secret_detected"
OUTPUT_BLOCKED = "output_blocked"

PromptSecrets = Literal["off", "refuse", "redact"]
PROMPT_SECRET_MODES: tuple[str, ...] = ("off", "refuse", "redact")

#: The detect-secrets plugins used, by module and class (their ``secret_type`` names the type in
#: messages and redactions). Left out: Base64/Hex high-entropy strings (hashes, ids and base64 data
#: in ordinary prompts), Secret Keyword (any ``password = "..."`` in a code sample; and about 500 us
#: per line), Public IP (not a secret), and the keyword-context vendor detectors Cloudant, IBM Cloud
#: IAM, IBM COS HMAC and SoftLayer (they flag ``key = "..."`` assignments in code samples, and cost
#: about 185 us per line together), and Artifactory (its ``AP[0-9A-F]...`` token is any spaced word
#: of 11+ letters such as "APACHECOMMONS"; and it alone cost a quarter of the scan).
SECRET_DETECTORS: tuple[tuple[str, str], ...] = (
    ("aws", "AWSKeyDetector"),
    ("private_key", "PrivateKeyDetector"),
    ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"),
    ("slack", "SlackDetector"),
    ("stripe", "StripeDetector"),
    ("jwt", "JwtTokenDetector"),
    ("openai", "OpenAIDetector"),
    ("azure_storage_key", "AzureStorageKeyDetector"),
    ("basic_auth", "BasicAuthDetector"),
    ("discord", "DiscordBotTokenDetector"),
    ("mailchimp", "MailchimpDetector"),
    ("npm", "NpmDetector"),
    ("pypi_token", "PypiTokenDetector"),
    ("sendgrid", "SendGridDetector"),
    ("square_oauth", "SquareOAuthDetector"),
    ("telegram_token", "TelegramBotTokenDetector"),
    ("twilio", "TwilioKeyDetector"),
)

#: Where a result body holds generated text (chat ``message.content``, tool call ``arguments``,
#: completions' ``text``, the Responses API's ``output[].content[].text``, reasoning): the strings
#: under these keys, at any depth, are what deny patterns are matched against.
GENERATED_TEXT_KEYS = frozenset({"content", "text", "arguments", "reasoning_content", "reasoning", "refusal"})

#: A pluggable output check: ``module.path:function``.
_CHECK_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
#: A detector's match is only where the secret starts (a PEM header; a JWT's lazily matched
#: signature): the redaction covers what these match from there.
_PEM_BLOCK = re.compile(
    r"(?:-----)?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"
    r"|PuTTY-User-Key-File-2.*?(?:Private-MAC: \w+|\Z)",
    re.DOTALL,
)
_JWT = re.compile(r"eyJ[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+(?:\.[A-Za-z0-9_.+/=-]*)?")
#: Other matches are extended over the token characters that follow them.
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_+/=-]*")

#: What a check returns: None (pass) or a short reason (blocked).
OutputCheck = Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Violation:
    """A line the policy turns into an error line: its ``code`` and ``message``."""

    code: str
    message: str


@dataclass(frozen=True)
class Secret:
    """One secret found in a string: its detect-secrets type and where it is (start, end)."""

    type: str
    start: int
    end: int


class GuardPolicy(BaseModel):
    """A tenant's prompt and output policy (``TenantPolicy.guard``; a snapshot of it rides in every
    ``WorkMessage`` of a batch). The defaults check nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Secrets in a request body: let them through (``off``), refuse the line, or redact them.
    prompt_secrets: PromptSecrets = "off"
    #: Python regular expressions; a result whose generated text matches one is blocked.
    output_deny_patterns: list[str] = Field(default_factory=list, max_length=limits.MAX_OUTPUT_DENY_PATTERNS)
    #: ``module:function`` checks, each given the result body; a returned reason blocks it.
    output_checks: list[str] = Field(default_factory=list, max_length=limits.MAX_OUTPUT_CHECKS)

    @field_validator("output_deny_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            parse_pattern(pattern)
        return patterns

    @field_validator("output_checks")
    @classmethod
    def _check_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _CHECK_NAME.match(name):
                raise ValueError(f"an output check is named module.path:function, got {name!r}")
        return names

    @property
    def active(self) -> bool:
        return self.prompt_secrets != "off" or bool(self.output_deny_patterns) or bool(self.output_checks)

    def check_prompt(self, body: Any) -> tuple[Any, Violation | None]:
        """The body to send and None; or (``refuse``) the body and the violation. ``redact``
        returns a copy with every secret replaced by ``[REDACTED:<type>]`` (the input is not
        changed); a body without secrets is returned as is."""
        if self.prompt_secrets == "off":
            return body, None
        if self.prompt_secrets == "refuse":
            types = sorted({s.type for text in _strings(body) for s in find_secrets(text)})
            if not types:
                return body, None
            return body, Violation(
                PROMPT_SECRET_DETECTED,
                f"The request contains a secret ({', '.join(types)}); this organization's policy refuses "
                "requests with secrets. Remove it and submit the request again.",
            )
        return _redacted(body), None

    def check_output(self, body: Any) -> Violation | None:
        """None if the result may be written; else the violation (``output_blocked``)."""
        if self.output_deny_patterns:
            texts = list(generated_texts(body))
            for index, pattern in enumerate(self.output_deny_patterns, 1):
                regex = parse_pattern(pattern)
                if any(regex.search(text) for text in texts):
                    return Violation(OUTPUT_BLOCKED, f"The result was blocked by this organization's output policy "
                                                     f"(deny pattern {index}).")
        for name in self.output_checks:
            try:
                reason = resolve_check(name)(body)
            except Exception as exc:  # noqa: BLE001 - fail closed: a check that cannot run blocks
                return Violation(OUTPUT_BLOCKED, f"The result was blocked: the output check {name} could not run "
                                                 f"({type(exc).__name__}).")
            if reason:
                return Violation(OUTPUT_BLOCKED, f"The result was blocked by this organization's output policy: "
                                                 f"{str(reason)[:200]}")
        return None


def active(policy: GuardPolicy | None) -> GuardPolicy | None:
    """The policy to snapshot into a batch's work messages: None when it checks nothing (a message
    then carries no policy at all, byte for byte as before policies existed)."""
    return policy if policy is not None and policy.active else None


# --- secrets ---------------------------------------------------------------------------------
@cache
def _detectors() -> tuple[Any, ...]:
    return tuple(
        getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)() for module, name in SECRET_DETECTORS
    )


def find_secrets(text: str) -> list[Secret]:
    """The secrets in ``text``, by position, overlapping findings merged (the first type kept).
    Detection is the plugins' own (``analyze_string``: a JWT must decode, for one); the span is
    the plugin's regex match that holds the value it reported, extended over the whole token (a
    PEM block to its END line, a JWT to its signature)."""
    found: list[Secret] = []
    for detector in _detectors():
        values = {v for v in detector.analyze_string(text) if v}
        if not values:
            continue
        for regex in detector.denylist:
            for match in regex.finditer(text):
                if any(v in match.group(0) for v in values):
                    start = match.start() - 5 if text.startswith("-----", match.start() - 5) else match.start()
                    found.append(Secret(detector.secret_type, max(0, start), _end_of(text, match)))
    found.sort(key=lambda s: (s.start, -s.end))
    merged: list[Secret] = []
    for secret in found:
        if merged and secret.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Secret(last.type, last.start, max(last.end, secret.end))
        else:
            merged.append(secret)
    return merged


def _end_of(text: str, match: re.Match[str]) -> int:
    for span in (_PEM_BLOCK, _JWT):
        whole = span.match(text, match.start())
        if whole is not None and whole.end() >= match.end():
            return whole.end()
    if not match.group(0) or not _TOKEN_TAIL.fullmatch(match.group(0)[-1]):
        return match.end()  # the match closes the secret (a URL's ``user:password@``, a quote)
    tail = _TOKEN_TAIL.match(text, match.end())
    return tail.end() if tail is not None else match.end()


def redact(text: str) -> str:
    """``text`` with every secret replaced by ``[REDACTED:<type>]``."""
    secrets = find_secrets(text)
    for secret in reversed(secrets):
        text = f"{text[:secret.start]}[REDACTED:{secret.type}]{text[secret.end:]}"
    return text


def _strings(value: Any) -> Iterator[str]:
    """Every string value in a JSON value, depth first (keys are not scanned)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    return value


# --- output ----------------------------------------------------------------------------------
def generated_texts(value: Any, *, inside: bool = False) -> Iterator[str]:
    """The strings of a result body under ``GENERATED_TEXT_KEYS`` (at any depth below them)."""
    if isinstance(value, str):
        if inside:
            yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from generated_texts(item, inside=inside or key in GENERATED_TEXT_KEYS)
    elif isinstance(value, list):
        for item in value:
            yield from generated_texts(item, inside=inside)


@lru_cache(maxsize=256)
def parse_pattern(pattern: str) -> re.Pattern[str]:
    """A deny pattern compiled; ValueError if it is not a valid regex, is empty or too long."""
    if not pattern:
        raise ValueError("a deny pattern must not be empty (it would block every result)")
    if len(pattern) > limits.MAX_OUTPUT_DENY_PATTERN_CHARS:
        raise ValueError(f"a deny pattern has at most {limits.MAX_OUTPUT_DENY_PATTERN_CHARS} characters")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression {pattern!r}: {exc}") from None


@cache
def resolve_check(name: str) -> OutputCheck:
    """The function a check name (``module.path:function``) names; ImportError/AttributeError/
    TypeError if there is none (batchctl resolves names when they are set; the worker fails the
    line closed)."""
    module, _, function = name.partition(":")
    check = getattr(importlib.import_module(module), function)
    if not callable(check):
        raise TypeError(f"{name} is not callable")
    return check  # type: ignore[no-any-return]


def output_secrets(body: dict[str, Any]) -> str | None:
    """The example output check (``functions.core.guard:output_secrets``): blocks a result whose
    generated text holds a secret (the prompt scan's detectors), e.g. a key the model recalled."""
    types = sorted({s.type for text in generated_texts(body) for s in find_secrets(text)})
    return f"the result contains a secret ({', '.join(types)})" if types else None


# --- command-line options (batchctl tenants create/set, batchctl run-batch) ------------------
def _pattern_arg(value: str) -> str | None:
    if value == "none":
        return None
    try:
        parse_pattern(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _check_arg(value: str) -> str | None:
    if value == "none":
        return None
    if not _CHECK_NAME.match(value):
        raise argparse.ArgumentTypeError(f"expected module.path:function, got {value!r}")
    try:
        resolve_check(value)
    except (ImportError, AttributeError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"no check {value!r}: {exc}") from None
    return value


def add_arguments(group: Any, *, default: Any = None) -> None:
    """The policy's options on an argparse parser or group (``default``: what an option not
    given leaves, e.g. ``argparse.SUPPRESS``)."""
    group.add_argument("--prompt-secrets", choices=PROMPT_SECRET_MODES, default=default,
                       help="secrets in request bodies: let through (off), refuse the line, or redact them")
    group.add_argument("--output-deny", type=_pattern_arg, action="append", default=default, metavar="REGEX",
                       help="block a result whose generated text matches REGEX; repeatable; 'none' clears the list")
    group.add_argument("--output-check", type=_check_arg, action="append", default=default, metavar="MODULE:FUNCTION",
                       help="a check given each result body (returns None or a reason); repeatable; 'none' clears")


def from_arguments(args: argparse.Namespace, base: GuardPolicy | None = None) -> GuardPolicy | None:
    """``base`` (or the default policy) with the options given in ``args``; a list option
    replaces the list (``none`` values dropped, so ``none`` alone clears it). None if no option was
    given and there is no base."""
    given = vars(args)
    names = {"prompt_secrets": "prompt_secrets", "output_deny": "output_deny_patterns", "output_check": "output_checks"}
    if base is None and all(given.get(option) is None for option in names):
        return None
    data = (base or GuardPolicy()).model_dump()
    for option, field in names.items():
        value = given.get(option)
        if value is None:
            continue
        data[field] = value if isinstance(value, str) else [v for v in value if v is not None]
    return GuardPolicy.model_validate(data)
