"""``vlembed ui``: ``vlembed serve --index DIR`` and the URL of its search page.

Every flag but ``--index`` is passed to ``vlembed serve`` (``--model``, ``--port``,
``--api-key``, ...). The URL is printed once the service answers ``/health``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import httpx

from preprocess_service import serve
from preprocess_service.settings import parse_settings

__all__ = ["main", "page_url"]

DEFAULT_INDEX = "vlembed-index"  # as vlembed index / vlembed search


def page_url(host: str, port: int) -> str:
    """The page's URL as a local browser reaches it (a wildcard address is this machine)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def _announce_when_ready(url: str, timeout: float = 3600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "health", timeout=2).status_code == 200:
                print(f"vlembed ui: search page at {url}", flush=True)
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vlembed ui",
        description="serve the search page (and /v1/search) over a document index",
        epilog="every other flag is a vlembed serve flag (--model, --port, --api-key, ...)",
    )
    parser.add_argument(
        "--index", default=DEFAULT_INDEX, help=f"index directory (default {DEFAULT_INDEX})"
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    serve_argv = [*rest, "--index", args.index]
    settings = parse_settings(serve_argv)  # a bad flag stops here, with serve's usage
    url = page_url(settings.host, settings.port)
    print(f"vlembed ui: starting on {url} (index {args.index}) ...", flush=True)
    threading.Thread(target=_announce_when_ready, args=(url,), daemon=True).start()
    return serve.main(serve_argv)
