"""No function of the GPU worker is over a cyclomatic complexity of 12 (ruff's mccabe rule C901;
docs/adr/0050-chunk-runner-built-once-per-worker.md): the chunk path stays split by concern."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_COMPLEXITY = 12


def test_no_function_of_the_worker_is_over_the_complexity_bound():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "C901", "--config",
         f"lint.mccabe.max-complexity={MAX_COMPLEXITY}", "--output-format", "concise", "gpu_worker"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
