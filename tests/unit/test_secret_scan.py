"""The secret scan that normalizes before it looks (``functions.core.secret_scan`` and the views
of a body in ``functions.core.guard``): a corpus of obfuscations, each refused (and, in redact
mode, refused as not redactable in place), with ordinary prompts in many scripts still passing;
the linear scan finds exactly what the plugins on Python's ``re`` find (``secret_oracle``) on
random texts, many texts scanned together find what each alone finds, and normalizing character
by character is NFKD of the whole text without its marks."""

import json
import random
import unicodedata

import pytest

from functions.core import secret_scan
from functions.core.guard import PROMPT_SECRET_DETECTED, GuardPolicy
from tests.unit import secret_oracle
from tests.unit.test_guard import NORMAL_PROMPTS, SECRETS, chat_body

AWS = SECRETS["AWS access key id"][1]
GITHUB = SECRETS["GitHub token"][1]
STRIPE = SECRETS["Stripe key"][1]


def spread(secret: str, mark: str) -> str:
    """``mark`` after every character of the secret's middle."""
    middle = len(secret) // 2
    return secret[:4] + "".join(c + mark for c in secret[4:middle]) + secret[middle:]


def user(content) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


def tool(name="lookup", description="Looks a record up.", properties=None) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": properties or {"id": {"type": "string", "description": "The id."}},
                    },
                },
            }
        ],
    }


def tool_call(arguments: str) -> dict:
    return {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ],
    }


def escaped(secret: str) -> str:
    """The secret as JSON \\u escapes (what json.loads reads back as the secret)."""
    return "".join(f"\\u{ord(c):04x}" for c in secret)


#: Each hides a secret from a scan of the raw string values; each is refused.
OBFUSCATED = {
    "zero-width space": user(f"key {spread(AWS, chr(0x200B))} ok"),
    "zero-width joiner": user(f"key {spread(GITHUB, chr(0x200D))} ok"),
    "zero-width non-joiner": user(f"key {spread(STRIPE, chr(0x200C))} ok"),
    "word joiner": user(f"key {spread(AWS, chr(0x2060))} ok"),
    "soft hyphen": user(f"key {spread(AWS, chr(0x00AD))} ok"),
    "byte order mark": user(f"key {spread(GITHUB, chr(0xFEFF))} ok"),
    "variation selector": user(f"key {spread(AWS, chr(0xFE0F))} ok"),
    "tag characters": user(f"key {spread(AWS, chr(0xE0041))} ok"),
    "bidi isolates": user(f"key {spread(STRIPE, chr(0x2066))} ok"),
    "combining marks": user(f"key {spread(AWS, chr(0x0301))} ok"),
    "combining grapheme joiner": user(f"key {spread(AWS, chr(0x034F))} ok"),
    "control characters": user(f"key {spread(AWS, chr(0x1B))} ok"),
    "full-width letters": user("key " + "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in AWS)),
    "mathematical bold": user(
        "key " + AWS[:4].translate({ord(c): 0x1D400 + ord(c) - ord("A") for c in AWS[:4]}) + AWS[4:]
    ),
    "accented letters": user("key " + AWS.replace("A", "Á")),
    "as a JSON key (tool schema property)": tool(properties={AWS: {"type": "string"}}),
    "as a metadata key": {**user("hi"), "metadata": {GITHUB: "x"}},
    "split across two text parts": user([{"type": "text", "text": AWS[:9]}, {"type": "text", "text": AWS[9:]}]),
    "split across parts with an image between": user(
        [
            {"type": "text", "text": GITHUB[:12]},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "text", "text": GITHUB[12:]},
        ]
    ),
    "split across Responses input parts": {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": STRIPE[:10]}, {"type": "input_text", "text": STRIPE[10:]}],
            }
        ],
    },
    "escaped in tool-call arguments": tool_call(json.dumps({"token": "x"}).replace('"x"', f'"{escaped(GITHUB)}"')),
    "as a key of tool-call arguments": tool_call('{"' + escaped(AWS) + '": 1}'),
    "zero-width space in a text part": user([{"type": "text", "text": spread(AWS, chr(0x200B))}]),
}


@pytest.mark.parametrize("name", sorted(OBFUSCATED))
def test_every_obfuscation_is_refused(name):
    body = OBFUSCATED[name]
    plain = [text for text in _values(body) if secret_scan.find_secrets(text)]
    assert plain == [], "not an obfuscation: a scan of the raw values sees it"
    same, violation = GuardPolicy(prompt_secrets="refuse").check_prompt(body)
    assert violation is not None and violation.code == PROMPT_SECRET_DETECTED
    assert same is body


@pytest.mark.parametrize("name", sorted(OBFUSCATED))
def test_redact_refuses_what_it_cannot_redact_in_place(name):
    body = OBFUSCATED[name]
    _, violation = GuardPolicy(prompt_secrets="redact").check_prompt(body)
    assert violation is not None and violation.code == PROMPT_SECRET_DETECTED
    assert "cannot be redacted in place" in violation.message


def test_tool_schema_strings_are_scanned_and_redacted_in_place():
    for body, secret in (
        (tool(name=f"call_{GITHUB}"), GITHUB),
        (tool(description=f"Uses {STRIPE}."), STRIPE),
        (tool(properties={"id": {"type": "string", "description": f"Use {AWS}."}}), AWS),
    ):
        assert GuardPolicy(prompt_secrets="refuse").check_prompt(body)[1].code == PROMPT_SECRET_DETECTED
        redacted, violation = GuardPolicy(prompt_secrets="redact").check_prompt(body)
        assert violation is None and secret not in json.dumps(redacted) and "[REDACTED:" in json.dumps(redacted)


def test_redact_still_redacts_a_plain_secret_and_refuses_a_hidden_one_beside_it():
    plain = user(f"charge with {STRIPE} please")
    redacted, violation = GuardPolicy(prompt_secrets="redact").check_prompt(plain)
    assert violation is None and redacted["messages"][0]["content"] == "charge with [REDACTED:Stripe Access Key] please"
    both = user([{"type": "text", "text": f"charge with {STRIPE}"}, {"type": "text", "text": spread(AWS, "\u200b")}])
    _, violation = GuardPolicy(prompt_secrets="redact").check_prompt(both)
    assert violation is not None and "AWS Access Key" in violation.message


#: Ordinary prompts in other scripts, with the characters the normalization removes or folds.
NORMAL_UNICODE = [
    "Café, crème brûlée et œufs: voilà le menu d’aujourd’hui.",
    "Grüße aus München! Die Straße ist gesperrt.",
    "東京の天気はどうですか？ 明日は晴れるでしょうか。",
    "Привет! Как дела? Расскажи о погоде в Москве.",
    "مرحبا، كيف حالك؟ ﷺ",
    "Family emoji: 👨‍👩‍👧‍👦 and a heart ❤️ and a flag 🏳️‍🌈.",
    "Full-width ＡＢＣ１２３ and ligatures ﬁ ﬂ, circled ①②③, math 𝐀𝐁𝐂.",
    "Soft\u00adhyphen and zero\u200bwidth and word\u2060joiner in prose.",
    "नमस्ते, आप कैसे हैं? हिन्दी में जवाब दें।",
    "한국어로 대답해 주세요. 감사합니다.",
]


def test_no_false_positive_on_ordinary_prompts_in_any_script():
    policy = GuardPolicy(prompt_secrets="refuse")
    for prompt in [*NORMAL_PROMPTS, *NORMAL_UNICODE]:
        body = chat_body(prompt)
        assert policy.check_prompt(body) == (body, None), prompt
        assert GuardPolicy(prompt_secrets="redact").check_prompt(body) == (body, None), prompt
    parts = user([{"type": "text", "text": p} for p in NORMAL_PROMPTS[:10]])
    schema = tool(properties={"city": {"type": "string", "description": "The city."}, "days": {"type": "integer"}})
    for body in (parts, schema, tool_call('{"city": "Paris", "days": 3}')):
        assert policy.check_prompt(body) == (body, None)


def _values(body):
    if isinstance(body, str):
        yield body
    elif isinstance(body, dict):
        for v in body.values():
            yield from _values(v)
    elif isinstance(body, list):
        for v in body:
            yield from _values(v)


# --- the linear scan finds what the plugins find ------------------------------------------------
PIECES = [s for _, s in SECRETS.values()] + [
    "AKIA",
    "eyJ",
    "eyJhbGciOiJIUzI1NiJ9",
    ".",
    "//",
    "/:_authToken=",
    "npm_",
    "sk-",
    "T3BlbkFJ",
    "xoxb-",
    "12-",
    "BEGIN RSA PRIVATE KEY",
    "-----",
    "-----END RSA PRIVATE KEY-----",
    "PuTTY-User-Key-File-2",
    "Private-MAC: ab12",
    "glpat-",
    "https://",
    "://",
    "user:",
    "pw@",
    "@",
    ":",
    "aws_key='",
    "'",
    '"',
    " ",
    "\n",
    "a",
    "Z",
    "0123456789",
    "é",
    "١٢٣٤٥٦٧٨٩",
    "\u00a0",
    "\u2028",
    "K",
    "ſ",
    "İ",
    "ı",
    "x" * 20,
    "A" * 16,
    "b" * 36,
    "AC",
    "SK",
    "0123456789abcdef",
    "-us1",
    "M",
    "SG.",
    "sq0csp-",
    "pypi-AgEIcHlwaS5vcmc",
    "AccountKey=",
    "+/=",
    "_",
    "-",
    "BLOCK",
    "PRIVATE KEY",
    "\t",
    "\x00",
]


def random_texts(seed: int, count: int, pieces: int = 30) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, pieces))) for _ in range(count)]


def test_the_linear_scan_finds_what_the_plugins_on_python_re_find():
    for text in random_texts(7, 600):
        assert secret_scan.find_secrets(text) == secret_oracle.find_secrets(text), repr(text)
    for _, secret in SECRETS.values():
        assert secret_scan.find_secrets(f"x {secret} y") == secret_oracle.find_secrets(f"x {secret} y")


def test_many_texts_scanned_together_find_what_each_alone_finds():
    texts = random_texts(11, 300, pieces=12)
    assert secret_scan.scan(texts) == [secret_scan.find_secrets(t) for t in texts]
    for text in texts:  # refuse mode asks for the types only: those the plugins report (before merging)
        reported = {d.secret_type for d in secret_oracle.detectors() if any(d.analyze_string(text))}
        assert secret_scan.types([text]) == reported, repr(text)
    # A secret never straddles two texts, even where the first ends as a secret starts.
    assert secret_scan.scan(["//a/:_authToken=", "npm_abc", "AKIA", AWS[4:]]) == [[], [], [], []]


def test_only_the_bounded_gitlab_patterns_run_on_python_re():
    assert secret_scan.on_python_re() == set(secret_scan.LINEAR_ON_PYTHON_RE) == {"GitLabTokenDetector"}


def test_normalizing_by_character_is_nfkd_of_the_whole_text_without_marks():
    rng = random.Random(5)
    alphabet = "aAé\u0301\u0316\u0323\u0307ﬁＡ①𝐀\u200b\u00ad\ufeffİıǄ\u1e69\ufdfa 한\u1100\u1161\x1b\u2060"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))
        whole = "".join(c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c)[0] != "M")
        whole = "".join(c for c in whole if c not in "\u200b\u00ad\ufeff\x1b\u2060")
        assert secret_scan.normalize(text) == whole, repr(text)
    assert secret_scan.normalize("plain ascii") == "plain ascii"
