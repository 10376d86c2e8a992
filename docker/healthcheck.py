#!/usr/bin/env python3
"""Container health probe for the API image: exit 0 when GET /health answers 200.

Standard library only; proxies are bypassed (the probe targets the container itself).
"""

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("VLEMBED_PORT") or "8000"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:  # URLError, HTTPError (non-2xx) and timeouts
        print(f"vlembed-healthcheck: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
