"""Serving must not pull in torch/transformers: they are optional extras."""

import subprocess
import sys


def test_serving_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import preprocess_service.serve, preprocess_service.api.app\n"
        "import preprocess_service.embedder, preprocess_service.model, preprocess_service.image\n"
        "heavy = [m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules]\n"
        "print(heavy); raise SystemExit(1 if heavy else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
