"""What every benchmark shares: ``vlembed serve`` in its own process, and page-like images."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent


def split_variant(label: str) -> tuple[str, str]:
    """ "Q4_K_M/bf16" -> ("Q4_K_M", "bf16"); a bare "Q8_0" -> ("Q8_0", "auto")."""
    text, _, mmproj = label.partition("/")
    return text, mmproj or "auto"


def page_image(w: int, h: int, seed: int = 0) -> Image.Image:
    """A document-like page: text lines and a few boxes, deterministic."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    y = 10
    while y < h - 20:
        x = 10
        while x < w - 40:
            wlen = int(rng.integers(15, 60))
            d.rectangle([x, y, x + wlen, y + 8], fill=(30, 30, 30))
            x += wlen + 8
        y += 18
    for _ in range(3):
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        d.rectangle(
            [x0, y0, x0 + w // 4, y0 + h // 6], fill=tuple(int(c) for c in rng.integers(0, 255, 3))
        )
    return img


class ServeProcess:
    """``vlembed serve`` in its own process, as users run it."""

    def __init__(
        self,
        model_dir: Path,
        variant: str,
        threads: int,
        parallel: int,
        tasks: str = "retrieval",
        vision_batch_tokens: int = 1,
        patch_transport: str = "auto",
        ready_timeout: float = 300,
    ) -> None:
        """``variant`` is a bench label, TEXT[/MMPROJ]. Images are encoded one per vision forward
        unless ``vision_batch_tokens`` says otherwise, so single-stream numbers stay comparable.
        ``patch_transport`` is serve's ``--patch-transport`` (auto: VLP1, f32: JSON rows);
        ``ready_timeout`` bounds the start (a full-depth model on a busy disk takes minutes)."""
        from preprocess_service.supervisor import free_port

        variant, mmproj = split_variant(variant)

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "vlembed.cli",
            "serve",
            "--model",
            str(model_dir),
            "--variant",
            variant,
            "--mmproj-variant",
            mmproj,
            "--port",
            str(self.port),
            "--threads",
            str(threads),
            "--parallel",
            str(parallel),
            "--tasks",
            tasks,
            "--ctx-size",
            "2048",
            "--log-level",
            "warning",
            "--vision-batch-tokens",
            str(vision_batch_tokens),
            "--patch-transport",
            patch_transport,
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("serve did not become healthy")

    def post(self, client: httpx.Client, body: dict) -> tuple[float, float]:
        """(total seconds seen by the client, seconds the service waited on llama-server)."""
        t = time.perf_counter()
        r = client.post(self.url + "/v1/embeddings", json=body, timeout=600)
        total = time.perf_counter() - t
        r.raise_for_status()
        return total, float(r.headers["x-backend-time"].removesuffix("ms")) / 1000

    def peak_rss_mb(self) -> float:
        """Peak resident memory of the llama-server(s) this serve started (VmHWM)."""
        total = 0
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        for child in children.split():
            for line in Path(f"/proc/{child}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        return total / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
