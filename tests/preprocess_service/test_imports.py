"""Serving must not pull in torch/transformers or Ray: they are optional extras."""

import subprocess
import sys


def test_serving_and_the_cli_import_no_torch_nor_ray() -> None:
    code = (
        "import sys\n"
        "import preprocess_service.serve, preprocess_service.api.app\n"
        "import preprocess_service.embedder, preprocess_service.model, preprocess_service.image\n"
        "import vlembed.cli, vlembed.index.cli\n"
        "heavy = [m for m in ('torch', 'transformers', 'safetensors', 'ray') if m in sys.modules]\n"
        "print(heavy); raise SystemExit(1 if heavy else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
