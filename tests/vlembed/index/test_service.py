"""The index's own service, and its llama-servers, do not outlive what started them.

Real processes: a parent that starts ``vlembed serve`` as ``vlembed index`` does, then dies by
SIGKILL (nothing of its own runs to stop the service); and a ``vlembed serve`` killed outright.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlembed.index.service import local_service_process

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
SERVE = ["--parallel", "1", "--threads", "1", "--tasks", "retrieval"]


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (whoever inherits an orphan may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(map(_running, pids)):
        time.sleep(0.2)
    return {p for p in pids if _running(p)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux")
def test_parent_killed_takes_the_service_and_its_llama_servers_down(tiny_converted: Path) -> None:
    code = (
        "import sys, time\n"
        "from vlembed.index.service import local_service_process\n"
        f"with local_service_process({str(tiny_converted)!r}, {SERVE!r}) as s:\n"
        "    print(s.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        serve = int(parent.stdout.readline())
        servers = _children(serve)
        assert servers, "the service runs its llama-server as a child"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone({serve, *servers}, 60) == set()
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux")
def test_service_killed_outright_takes_its_llama_servers_down(tiny_converted: Path) -> None:
    with local_service_process(str(tiny_converted), SERVE) as service:
        servers = _children(service.pid)
        assert servers
        os.kill(service.pid, signal.SIGKILL)
        assert _wait_gone(servers, 30) == set()
