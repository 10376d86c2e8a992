"""The import contracts in pyproject.toml hold: layers point one way, the contract stands alone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports (import-linter, in the dev extra) is not installed")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_vlembed_imports_and_exports_its_public_names() -> None:
    import vlembed

    assert sorted(vlembed.__all__) == ["Client", "Index", "ServiceError", "__version__"]
    assert vlembed.Client.__module__ == "vlembed.client"
