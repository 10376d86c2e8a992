"""docs/limits.md lists every limit flag of `vlembed serve` with its variable and default."""

from __future__ import annotations

import re
from pathlib import Path

from preprocess_service.settings import ServeSettings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "limits.md").read_text()
LIMITS = (
    "max_body_bytes",
    "body_timeout",
    "max_items",
    "max_text_chars",
    "max_image_bytes",
    "max_queue",
    "request_timeout",
    "hang_timeout",
    "max_connections",
    "ctx_size",
)


def test_every_limit_is_documented_with_its_default(monkeypatch) -> None:
    for var in [v for v in __import__("os").environ if v.startswith("VLEMBED_")]:
        monkeypatch.delenv(var)
    defaults = ServeSettings()
    for name in LIMITS:
        flag, env = "--" + name.replace("_", "-"), "VLEMBED_" + name.upper()
        row = re.search(rf"^\| `{flag}` \| `{env}` \| ([^|]+) \|", DOC, re.M)
        assert row, f"{flag} is not in docs/limits.md"
        documented = float(re.match(r"[\d.]+", row.group(1).strip()).group(0))
        assert documented == float(getattr(defaults, name)), (flag, row.group(1))
