"""Prompt and output policies: the ONE implementation, used by ingest (which snapshots a tenant's
policy into every work message of a batch), by the GPU worker (every line, retries and
redeliveries included, since the policy travels in the message; the checks run in separate
processes, ``gpu_worker.policy_checks``) and by the offline ``batchctl run-batch``.
docs/governance.md, "Prompt and output policies".

- **Prompt**: the request's ``body`` is scanned for secrets (``secret_scan``: detect-secrets'
  plugins run in linear time): every string value, every key, the text parts of one message
  joined, the keys and values of tool-call ``arguments`` (JSON in a string), and each of them as
  ``secret_scan.normalize`` reads it (invisible characters removed, compatibility forms folded).
  ``refuse``: the line becomes an error line ``prompt_secret_detected`` (the message names the
  secret's type, never the secret) and is not sent to the engine; ``redact``: each secret in a
  string value is replaced by ``[REDACTED:<type>]`` and the redacted body is sent, but a secret
  seen only in a key, only once normalized, only with the parts joined or only inside parsed
  arguments cannot be replaced in place: such a line is refused.
- **Output**: a 2xx result's generated text (``GENERATED_TEXT_KEYS``) is matched against the
  policy's deny patterns (RE2 syntax, run by RE2 in linear time), then the result body is given to
  each pluggable check (``module:function`` taking the body, returning None or a reason). A match,
  a reason, or a check or pattern that cannot run (fail closed) turns the line into an error line
  ``output_blocked``; the result body is not written.

detect-secrets and RE2 are imported on first use (worker dependencies; the Lambdas import this
module for ``GuardPolicy`` only, whose validation needs neither: a pattern is compiled by RE2 when
``batchctl tenants`` sets it and when the worker uses it)."""

from __future__ import annotations

import argparse
import importlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import limits
from .secret_scan import (
    SECRET_DETECTORS,
    Secret,
    find_secrets,
    normalize,
    redact,
    redacted,
    scan,
    types,
)

__all__ = ["SECRET_DETECTORS", "Secret", "find_secrets", "normalize", "redact"]

#: Error codes of the lines the policy turns into errors.
PROMPT_SECRET_DETECTED = "prompt_secret_detected"
OUTPUT_BLOCKED = "output_blocked"
#: Error codes of the lines whose check did not end (``gpu_worker.policy_checks``): it ran past
#: ``limits.POLICY_CHECK_SECONDS``, its input is over ``limits.POLICY_CHECK_MAX_INPUT_BYTES``, or
#: its process died. Such a line is never sent to the engine (prompt) nor written (output).
POLICY_CHECK_TIMEOUT = "policy_check_timeout"
POLICY_CHECK_INPUT_TOO_LARGE = "policy_check_input_too_large"
POLICY_CHECK_FAILED = "policy_check_failed"

PromptSecrets = Literal["off", "refuse", "redact"]
PROMPT_SECRET_MODES: tuple[str, ...] = ("off", "refuse", "redact")

#: Where a result body holds generated text (chat ``message.content``, tool call ``arguments``,
#: completions' ``text``, the Responses API's ``output[].content[].text``, reasoning): the strings
#: under these keys, at any depth, are what deny patterns are matched against.
GENERATED_TEXT_KEYS = frozenset({"content", "text", "arguments", "reasoning_content", "reasoning", "refusal"})

#: A pluggable output check: ``module.path:function``.
_CHECK_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
#: What a check returns: None (pass) or a short reason (blocked).
OutputCheck = Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Violation:
    """A line the policy turns into an error line: its ``code`` and ``message``."""

    code: str
    message: str


class GuardPolicy(BaseModel):
    """A tenant's prompt and output policy (``TenantPolicy.guard``; a snapshot of it rides in every
    ``WorkMessage`` of a batch). The defaults check nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Secrets in a request body: let them through (``off``), refuse the line, or redact them.
    prompt_secrets: PromptSecrets = "off"
    #: RE2 regular expressions; a result whose generated text matches one is blocked.
    output_deny_patterns: list[str] = Field(default_factory=list, max_length=limits.MAX_OUTPUT_DENY_PATTERNS)
    #: ``module:function`` checks, each given the result body; a returned reason blocks it.
    output_checks: list[str] = Field(default_factory=list, max_length=limits.MAX_OUTPUT_CHECKS)

    @field_validator("output_deny_patterns")
    @classmethod
    def _patterns_bounded(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            check_pattern_size(pattern)
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

    def compiled(self) -> GuardPolicy:
        """This policy, once every deny pattern compiles with RE2 (``parse_pattern``'s ValueError
        naming the pattern's place otherwise): what ``batchctl`` stores."""
        for index, pattern in enumerate(self.output_deny_patterns, 1):
            try:
                parse_pattern(pattern)
            except ValueError as exc:
                raise ValueError(f"output deny pattern {index}: {exc}") from None
        return self

    def check_prompt(self, body: Any) -> tuple[Any, Violation | None]:
        """The body to send and None; or (``refuse``) the body and the violation. ``redact``
        returns a copy with every secret in a string value replaced by ``[REDACTED:<type>]``
        (the input is not changed; a body without secrets is returned as is), or the violation
        when a secret remains that only a key, the joined parts, parsed arguments or the
        normalized text show."""
        if self.prompt_secrets == "off":
            return body, None
        values = _unique(_strings(body))
        types = secret_types([*values, *hidden_texts(body, values)])
        if self.prompt_secrets == "refuse" or not types:
            return body, (_refused(types) if types else None)
        found = dict(zip(values, scan(values), strict=True))
        if any(found.values()):
            body = _redacted(body, {text: redacted(text, secrets) for text, secrets in found.items() if secrets})
            values = _unique(_strings(body))
        types = secret_types(hidden_texts(body, values))
        if types:
            return body, _refused(types, in_place=False)
        return body, None

    def check_output(self, body: Any) -> Violation | None:
        """None if the result may be written; else the violation (``output_blocked``)."""
        if self.output_deny_patterns:
            texts = [_scannable(text) for text in generated_texts(body)]
            for index, pattern in enumerate(self.output_deny_patterns, 1):
                try:
                    regex = parse_pattern(pattern)
                except ValueError:  # stored before RE2 ran them: fail closed until the operator replaces it
                    return Violation(
                        OUTPUT_BLOCKED,
                        f"The result was blocked: deny pattern {index} of this "
                        "organization's output policy cannot be run (it is not RE2 syntax).",
                    )
                if any(regex.search(text) for text in texts):
                    return Violation(
                        OUTPUT_BLOCKED,
                        f"The result was blocked by this organization's output policy (deny pattern {index}).",
                    )
        for name in self.output_checks:
            try:
                reason = resolve_check(name)(body)
            except Exception as exc:  # noqa: BLE001 - fail closed: a check that cannot run blocks
                return Violation(
                    OUTPUT_BLOCKED,
                    f"The result was blocked: the output check {name} could not run ({type(exc).__name__}).",
                )
            if reason:
                return Violation(
                    OUTPUT_BLOCKED, f"The result was blocked by this organization's output policy: {str(reason)[:200]}"
                )
        return None


def _refused(types: set[str], *, in_place: bool = True) -> Violation:
    names = ", ".join(sorted(types))
    if in_place:
        return Violation(
            PROMPT_SECRET_DETECTED,
            f"The request contains a secret ({names}); this organization's policy "
            "refuses requests with secrets. Remove it and submit the request again.",
        )
    return Violation(
        PROMPT_SECRET_DETECTED,
        f"The request contains a secret ({names}) that cannot be redacted in place "
        "(it is hidden by invisible or look-alike characters, split across text parts, "
        "escaped in tool-call arguments, or in a key); this organization's policy "
        "refuses it. Remove it and submit the request again.",
    )


def active(policy: GuardPolicy | None) -> GuardPolicy | None:
    """The policy to snapshot into a batch's work messages: None when it checks nothing (a message
    then carries no policy at all: the same bytes as in a deployment without policies)."""
    return policy if policy is not None and policy.active else None


# --- secrets ---------------------------------------------------------------------------------
def secret_types(texts: list[str]) -> set[str]:
    """The types of the secrets in ``texts`` (scanned together)."""
    return types(texts)


def hidden_texts(body: Any, values: list[str]) -> list[str]:
    """What a scan of the body's string values (``values``) alone would not see: its keys, the
    text parts of each list joined (a message's ``content`` parts, the Responses API's), the keys
    and values of every ``arguments`` string that is JSON (tool calls), and the normalized form
    of each of these and of the values, where it differs."""
    plain = _unique([*_keys(body), *_joined_parts(body), *_arguments(body)])
    seen = set(values)
    extra = [text for text in plain if text not in seen]
    normalized = _unique(n for text in (*values, *plain) if (n := normalize(text)) != text)
    return [*extra, *(text for text in normalized if text not in seen)]


def _unique(texts: Any) -> list[str]:
    return list(dict.fromkeys(texts))


def _walk(value: Any) -> Iterator[Any]:
    """Every value in a JSON value, depth first, without recursion (parsed arguments may nest deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _strings(value: Any) -> Iterator[str]:
    """Every string value in a JSON value, depth first."""
    return (item for item in _walk(value) if isinstance(item, str))


def _keys(value: Any) -> Iterator[str]:
    for item in _walk(value):
        if isinstance(item, dict):
            yield from (key for key in item if isinstance(key, str))


def _joined_parts(value: Any) -> Iterator[str]:
    """The ``text`` of every list's parts joined, for lists of two text parts or more."""
    for item in _walk(value):
        if isinstance(item, list):
            texts = [part["text"] for part in item if isinstance(part, dict) and isinstance(part.get("text"), str)]
            if len(texts) > 1:
                yield "".join(texts)


def _arguments(value: Any) -> Iterator[str]:
    """The keys and string values of every ``arguments`` string that parses as JSON."""
    for item in _walk(value):
        if isinstance(item, dict) and isinstance(arguments := item.get("arguments"), str):
            try:
                parsed = json.loads(arguments)
            except (ValueError, RecursionError):
                continue
            yield from _keys(parsed)
            yield from _strings(parsed)


def _redacted(value: Any, replaced: dict[str, str]) -> Any:
    """``value`` with each string that is a key of ``replaced`` replaced by its value."""
    if isinstance(value, str):
        return replaced.get(value, value)
    if isinstance(value, dict):
        return {key: _redacted(item, replaced) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item, replaced) for item in value]
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


def check_pattern_size(pattern: str) -> str:
    """ValueError if a deny pattern is empty or too long (all that ``GuardPolicy`` validates)."""
    if not pattern:
        raise ValueError("a deny pattern must not be empty (it would block every result)")
    if len(pattern) > limits.MAX_OUTPUT_DENY_PATTERN_CHARS:
        raise ValueError(f"a deny pattern has at most {limits.MAX_OUTPUT_DENY_PATTERN_CHARS} characters")
    return pattern


@lru_cache(maxsize=256)
def parse_pattern(pattern: str) -> Any:
    """A deny pattern compiled by RE2 (linear time in the text it is matched against); ValueError
    if it is empty, too long, or not RE2 syntax (backreferences and lookarounds are not: they
    cannot run in linear time)."""
    import re2  # a worker and batchctl dependency: the Lambdas never compile a pattern

    check_pattern_size(pattern)
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(
            f"not a valid RE2 regular expression {pattern!r}: {reason} (deny patterns run in "
            "linear time: backreferences and lookarounds are not available)"
        ) from None


def _scannable(text: str) -> str:
    """``text`` with lone surrogates (which a JSON answer may hold) as U+FFFD, one for one: RE2 reads UTF-8."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


@cache
def resolve_check(name: str) -> OutputCheck:
    """The function a check name (``module.path:function``) names; ImportError/AttributeError/
    TypeError if there is none (batchctl resolves names when they are set; the worker fails the
    line closed)."""
    module, _, function = name.partition(":")
    check = getattr(importlib.import_module(module), function)
    if not callable(check):
        raise TypeError(f"{name} is not callable")
    return check


def output_secrets(body: dict[str, Any]) -> str | None:
    """The example output check (``functions.core.guard:output_secrets``): blocks a result whose
    generated text holds a secret (the prompt scan's detectors, on the text and its normalized
    form), e.g. a key the model recalled."""
    texts = _unique(generated_texts(body))
    types = sorted(secret_types([*texts, *(n for text in texts if (n := normalize(text)) != text)]))
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
    group.add_argument(
        "--prompt-secrets",
        choices=PROMPT_SECRET_MODES,
        default=default,
        help="secrets in request bodies: let through (off), refuse the line, or redact them",
    )
    group.add_argument(
        "--output-deny",
        type=_pattern_arg,
        action="append",
        default=default,
        metavar="REGEX",
        help="block a result whose generated text matches REGEX; repeatable; 'none' clears the list",
    )
    group.add_argument(
        "--output-check",
        type=_check_arg,
        action="append",
        default=default,
        metavar="MODULE:FUNCTION",
        help="a check given each result body (returns None or a reason); repeatable; 'none' clears",
    )


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
    return GuardPolicy.model_validate(data).compiled()
