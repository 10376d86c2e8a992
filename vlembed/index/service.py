"""A ``vlembed serve`` of our own for commands run without ``--server``.

Started exactly as a user would start it (``python -m vlembed.cli serve --model M --port P``,
same default model when none is given), as a subprocess: the index must not import the service
(``vlembed`` is the bottom layer), and a subprocess is stopped cleanly with everything it
started. Its output goes to a log file whose tail is shown if it fails to come up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from vlembed.children import dying_with_parent

__all__ = ["LocalService", "local_service", "local_service_process"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@dataclasses.dataclass(frozen=True)
class LocalService:
    """A started ``vlembed serve``.

    Attributes:
        url: Its root URL.
        pid: Its process id, also the id of its process group; its llama-servers die with it
            (``os.kill(pid, SIGKILL)`` takes the replica down as a crashed machine would).
    """

    url: str
    pid: int


@contextlib.contextmanager
def local_service(
    model: str | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 1800.0,
) -> Iterator[str]:
    """Run ``vlembed serve`` on a free local port for the duration of the block; yields its URL.

    The timeout is long because the first run without ``--model`` builds llama.cpp and a tiny
    checkpoint.
    """
    with local_service_process(model, extra_args, startup_timeout) as service:
        yield service.url


@contextlib.contextmanager
def local_service_process(
    model: str | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 1800.0,
) -> Iterator[LocalService]:
    """:func:`local_service`, yielding the process too (to stop it from outside)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "vlembed.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if model is not None:
        cmd += ["--model", model]
    cmd += list(extra_args)
    log_fd, log_name = tempfile.mkstemp(prefix="vlembed-serve-", suffix=".log")
    log_path = Path(log_name)
    url = f"http://127.0.0.1:{port}"
    print(f"starting {' '.join(cmd[1:])} (log: {log_path})", file=sys.stderr)
    proc = subprocess.Popen(
        # SIGTERM (a clean stop of its llama-servers) when this thread ends without stopping it
        dying_with_parent(cmd, "TERM"),
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(log_fd)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"vlembed serve exited with status {proc.returncode}:\n{_tail(log_path)}"
                )
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vlembed serve not healthy after {startup_timeout:.0f} s:\n{_tail(log_path)}"
                )
            time.sleep(0.3)
        yield LocalService(url, proc.pid)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the service (it stops its llama-servers), SIGKILL to the group if it hangs.

    A service that died on its own took its llama-servers with it (parent-death signal); what
    is left of its process group is killed.
    """
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
