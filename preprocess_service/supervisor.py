"""Starts, watches and restarts the local patched llama-server processes.

One process per served task (each task has its own merged text GGUF; all share one mmproj).
A process that exits is restarted with a capped exponential backoff; its backend is marked
unhealthy meanwhile, so requests get a clean 503 (or go to another replica) instead of hanging.
A process that is alive but hung (see :func:`hang_reason`) is killed, and so restarted the same
way: a live process that answers nothing is worse than a dead one, since nothing restarts it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlembed.children import dying_with_parent

log = logging.getLogger("vlembed.supervisor")


def llama_server_binary() -> Path:
    """``$VLEMBED_LLAMA_SERVER`` when set (a prebuilt binary, e.g. in a container), else the
    cached build of the pinned llama.cpp with our patches (built on first use)."""
    override = os.environ.get("VLEMBED_LLAMA_SERVER")
    if override:
        return Path(override)
    from llama_patches.build import server_binary

    return server_binary()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Image tokens per shared vision forward: two document pages (744 tokens each at jina-v4's
# max_pixels; llama.cpp's own 1024 admitted only one). The tower's activations grow with it
# (flash attention keeps the per-image attention linear in memory).
VISION_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class ServerSpec:
    """How to start one llama-server. ``ctx_per_slot`` also sizes the (u)batch: llama.cpp
    refuses an embedding prompt longer than one ubatch with a 500, so they must match."""

    binary: Path
    model: Path
    mmproj: Path
    port: int
    host: str = "127.0.0.1"
    parallel: int = 2
    threads: int | None = None
    ctx_per_slot: int = 4096
    # llama.cpp's CPU flash attention costs precision: with it the worst text row after a
    # 736-token image drops from 0.9999994 to 0.9999925 against the reference. Off by default.
    flash_attn: str = "off"
    # The vision tower's rows are unaffected by flash attention (>= 0.9999993 either way), and
    # without it Qwen2.5-VL's masked window attention is ~7x slower on page-sized images.
    mmproj_flash_attn: str = "on"
    # CPU weight repacking: off lets K-quants reach ggml's tiled VNNI kernels (serve decides).
    repack: bool = True
    # Images of requests in flight together are encoded in one vision forward, up to this many
    # output tokens (patches 0006, 0009); 1 turns it off.
    vision_batch_tokens: int = VISION_BATCH_TOKENS
    # Upper bound of merged image tokens per image (llama-server --image-max-tokens): the server
    # admits precomputed patches up to 4x this many patches and refuses larger grids with a 400.
    # Unset, llama.cpp's Qwen2.5-VL default of 4096 tokens (16384 patches) applies, whose window
    # mask alone is a 1 GiB host buffer per image. Set it from the served model's max_pixels
    # (max_pixels // 28**2).
    image_max_tokens: int | None = None
    # Lower bound (--image-min-tokens); only llama.cpp's own resize of raw images uses it.
    image_min_tokens: int | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("image_max_tokens", "image_min_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

    def argv(self) -> list[str]:
        args = [
            str(self.binary),
            "-m",
            str(self.model),
            "--mmproj",
            str(self.mmproj),
            "--embeddings",
            "--pooling",
            "none",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "-np",
            str(self.parallel),
            "-c",
            str(self.ctx_per_slot * self.parallel),
            "-b",
            str(self.ctx_per_slot),
            "-ub",
            str(self.ctx_per_slot),
            "--no-kv-unified",
            "--no-webui",
            "-fa",
            self.flash_attn,
            "--mmproj-flash-attn",
            self.mmproj_flash_attn,
            "--mtmd-batch-max-tokens",
            str(self.vision_batch_tokens),
        ]
        if self.image_max_tokens is not None:
            args += ["--image-max-tokens", str(self.image_max_tokens)]
        if self.image_min_tokens is not None:
            args += ["--image-min-tokens", str(self.image_min_tokens)]
        if not self.repack:
            args.append("--no-repack")
        if self.threads:
            args += ["-t", str(self.threads)]
        return args + list(self.extra_args)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class ManagedServer:
    spec: ServerSpec
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _backoff: float = 0.5
    _next_start: float = 0.0
    started_at: float = field(default=0.0)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        # SIGKILL when the service dies without stopping it
        self.proc = subprocess.Popen(
            dying_with_parent(self.spec.argv()),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # our Ctrl-C is ours; we stop it explicitly
        )
        logf.close()
        self.started_at = time.monotonic()
        log.info("started llama-server pid %d on %s", self.proc.pid, self.spec.url)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def maybe_restart(self) -> bool:
        """Restart a dead process once its backoff has passed. Returns True when restarted."""
        code = self.exited()
        if code is None:
            if time.monotonic() - self.started_at > 30:
                self._backoff = 0.5  # ran long enough: forget past crashes
            return False
        now = time.monotonic()
        if self._next_start == 0.0:
            log.error("llama-server on %s exited with %s; restarting", self.spec.url, code)
            self._next_start = now + self._backoff
            self._backoff = min(self._backoff * 2, 30.0)
        if now < self._next_start:
            return False
        self._next_start = 0.0
        self.restarts += 1
        self.start()
        return True

    def kill(self) -> None:
        """SIGKILL a hung server (a stopped one too); :meth:`maybe_restart` then replaces it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            if self.proc.poll() is None:  # ignored SIGTERM: force it
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)


def hang_reason(
    *,
    now: float,
    started_at: float,
    probe_since: float | None,
    stalled_for: float,
    hang_timeout: float,
    stall_timeout: float,
) -> str | None:
    """Why a live llama-server counts as hung, or None.

    Two signs, because they fail apart: its HTTP threads answer ``/health`` even when the loop
    that computes embeddings is stuck, and a stopped or thrashing process answers nothing at
    all. ``probe_since`` is when the ``/health`` probe still waiting for any answer was sent
    (a loading server answers 503, so a slow model load is not a hang); the process gets
    ``hang_timeout`` from its start to begin listening. ``stalled_for`` is how long requests
    have been on the wire with no answer (``Backend.stalled_for``). The stall limit belongs a
    little under the request timeout: the service gives up on a request then, which takes the
    evidence off the wire, and a server that answered nothing for that long has already cost a
    request.
    """
    if probe_since is not None:
        silent = now - max(started_at, probe_since)
        if silent > hang_timeout:
            return f"answered no /health for {silent:.0f} s"
    if stalled_for > stall_timeout:
        return f"answered no embedding request for {stalled_for:.0f} s"
    return None
