"""docker/*.sh and docker/healthcheck.py, run for real against stub programs.

The stubs (`llama-server`, `vlembed`) record their arguments and environment, so the exact
command lines the containers run are checked without Docker, a build or a model.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from preprocess_service.supervisor import VISION_BATCH_TOKENS
from tests.deploy.deploy_helpers import (
    DOCKER,
    LLAMA_PORT,
    MANIFEST_IMAGE_MAX_TOKENS,
    RECORDER,
    SERVE_FLAGS,
    write_manifest,
)
from tests.deploy.deploy_helpers import llama_server_flags as _flags
from tests.deploy.deploy_helpers import run_docker_script as _run
from tests.deploy.deploy_helpers import stub_program as _stub

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")

# ------------------------------------------------------------------ llama-server entrypoint


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    write_manifest(d)
    for name in (
        "text-retrieval-f16.gguf",
        "text-retrieval-Q4_K_M.gguf",
        "text-code-f16.gguf",
        "mmproj-f16.gguf",
    ):
        (d / name).write_text("{}")
    _stub(tmp_path / "bin", "llama-server")
    return d


def test_llama_server_command_line_defaults(model_dir: Path, tmp_path: Path) -> None:
    proc, rec = _run("llama-server-entrypoint.sh", tmp_path, {"VLEMBED_MODEL": str(model_dir)})
    assert proc.returncode == 0, proc.stderr
    assert _flags(rec["argv"]) == {
        "-m": f"{model_dir}/text-retrieval-f16.gguf",
        "--mmproj": f"{model_dir}/mmproj-f16.gguf",
        "--embeddings": True,
        "--pooling": "none",
        "--host": "0.0.0.0",
        "--port": str(LLAMA_PORT),
        "-np": "2",
        "-c": "8192",
        "-b": "4096",
        "-ub": "4096",
        "--no-kv-unified": True,
        "--no-webui": True,
        "-fa": "on",  # auto: on for the f16 default, off only for f32
        "--mmproj-flash-attn": "on",
        "--mtmd-batch-max-tokens": str(VISION_BATCH_TOKENS),  # serve's default
        "--image-max-tokens": str(MANIFEST_IMAGE_MAX_TOKENS),  # manifest max_pixels / 28²
    }


def test_llama_server_command_line_from_variables(model_dir: Path, tmp_path: Path) -> None:
    env = {
        "VLEMBED_MODEL": str(model_dir),
        "VLEMBED_TASK": "retrieval",
        "VLEMBED_VARIANT": "Q4_K_M",
        "VLEMBED_MMPROJ_DTYPE": "f16",
        "VLEMBED_PARALLEL": "3",
        "VLEMBED_CTX_SIZE": "2048",
        "VLEMBED_THREADS": "7",
        "VLEMBED_LLAMA_PORT": "9090",
    }
    proc, rec = _run("llama-server-entrypoint.sh", tmp_path, env, "--no-mmproj-offload")
    assert proc.returncode == 0, proc.stderr
    assert rec["argv"][-1] == "--no-mmproj-offload"
    flags = _flags(rec["argv"][:-1])
    assert flags["-m"] == f"{model_dir}/text-retrieval-Q4_K_M.gguf"
    assert (flags["-np"], flags["-t"], flags["-c"], flags["--port"]) == ("3", "7", "6144", "9090")
    assert flags["-ub"] == flags["-b"] == "2048"
    assert flags["--no-repack"]  # auto: K-quants run ggml's tiled kernels, not repacked ones
    env["VLEMBED_REPACK"] = "on"
    proc, rec = _run("llama-server-entrypoint.sh", tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "--no-repack" not in rec["argv"]


def test_llama_server_command_line_is_the_one_serve_uses(model_dir: Path, tmp_path: Path) -> None:
    """Same flags and values as the supervisor of `vlembed serve` for the same settings."""
    try:
        from preprocess_service.supervisor import ServerSpec
    except ImportError:
        pytest.skip("preprocess_service.supervisor is not importable")
    for threads in (None, 6):
        spec = ServerSpec(
            binary=Path("llama-server"),
            model=model_dir / "text-retrieval-f16.gguf",
            mmproj=model_dir / "mmproj-f16.gguf",
            port=LLAMA_PORT,
            host="0.0.0.0",
            parallel=3,
            threads=threads,
            ctx_per_slot=1024,
            flash_attn="on",  # what serve's --flash-attn auto picks for the f16 variant
            image_max_tokens=MANIFEST_IMAGE_MAX_TOKENS,  # what serve derives from the manifest
        )
        env = {
            "VLEMBED_MODEL": str(model_dir),
            "VLEMBED_PARALLEL": "3",
            "VLEMBED_CTX_SIZE": "1024",
            "VLEMBED_THREADS": str(threads or ""),
        }
        proc, rec = _run("llama-server-entrypoint.sh", tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        assert _flags(rec["argv"]) == _flags(spec.argv()[1:])


def test_llama_server_empty_threads_is_left_to_llama_server(
    model_dir: Path, tmp_path: Path
) -> None:
    """compose passes VLEMBED_THREADS as ${VLEMBED_THREADS:-}, i.e. empty when unset."""
    env = {"VLEMBED_MODEL": str(model_dir), "VLEMBED_THREADS": "", "VLEMBED_TASK": "code"}
    proc, rec = _run("llama-server-entrypoint.sh", tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "-t" not in _flags(rec["argv"])
    assert _flags(rec["argv"])["-m"].endswith("text-code-f16.gguf")


@pytest.mark.parametrize(
    ("env", "files", "message"),
    [
        ({}, ["manifest.json"], "convert a checkpoint"),
        ({"VLEMBED_VARIANT": "IQ4_XS"}, [], "text-retrieval-IQ4_XS.gguf not found"),
        (
            {},
            ["text-retrieval-f16.gguf", "text-retrieval-Q4_K_M.gguf", "text-code-f16.gguf"],
            "GGUF files there: mmproj-f16.gguf",
        ),
        ({"VLEMBED_MMPROJ_DTYPE": "f32"}, [], "mmproj-f32.gguf not found"),
        ({}, ["mmproj-f16.gguf"], "no mmproj"),
        ({}, ["-add-", "mmproj-f32.gguf"], "several mmproj"),
        ({"VLEMBED_PARALLEL": "zero"}, [], "VLEMBED_PARALLEL must be a positive integer"),
        ({"VLEMBED_CTX_SIZE": "0"}, [], "VLEMBED_CTX_SIZE must be a positive integer"),
        ({"VLEMBED_THREADS": "-1"}, [], "VLEMBED_THREADS must be a positive integer"),
        ({}, ["-add-", "manifest.json"], "manifest.json has no max_pixels"),
    ],
)
def test_llama_server_refuses_bad_setups(
    model_dir: Path, tmp_path: Path, env: dict[str, str], files: list[str], message: str
) -> None:
    if files[:1] == ["-add-"]:
        for name in files[1:]:
            (model_dir / name).write_text("{}")
    else:
        for name in files:
            (model_dir / name).unlink()
    proc, rec = _run(
        "llama-server-entrypoint.sh", tmp_path, {"VLEMBED_MODEL": str(model_dir), **env}
    )
    assert proc.returncode == 2 and rec is None
    assert message in proc.stderr


# ------------------------------------------------------------------------- serve entrypoint


@pytest.fixture
def serve_stub(tmp_path: Path) -> Path:
    _stub(tmp_path / "bin", "vlembed")
    return tmp_path


def _serve(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[list[str], dict[str, str]]:
    proc, rec = _run("serve-entrypoint.sh", tmp_path, env, *args)
    assert proc.returncode == 0, proc.stderr
    return rec["argv"], rec["env"]


def test_serve_lists_the_replicas_of_the_backend_service(serve_stub: Path) -> None:
    argv, env = _serve(
        serve_stub,
        {
            "VLEMBED_BACKENDS": "",
            "BACKEND_SERVICE": "llama-server-gpu",
            "BACKEND_REPLICAS": "3",
            "BACKEND_PROJECT": "emb",
            "BACKEND_TASK": "retrieval",
        },
        "--allow-url-fetch",
    )
    assert argv == ["serve", "--allow-url-fetch"]
    assert env["VLEMBED_BACKENDS"] == ",".join(
        f"retrieval=http://emb-llama-server-gpu-{i}:{LLAMA_PORT}" for i in (1, 2, 3)
    )
    assert not {k for k in env if k.startswith("BACKEND_")}, "helper variables leak into serve"


def test_serve_keeps_explicit_backends(serve_stub: Path) -> None:
    explicit = "retrieval=http://gpu-a:8080,code=http://gpu-b:8080"
    _, env = _serve(serve_stub, {"VLEMBED_BACKENDS": explicit, "BACKEND_SERVICE": "llama-server"})
    assert env["VLEMBED_BACKENDS"] == explicit


def test_serve_without_backend_service_starts_its_own_servers(serve_stub: Path) -> None:
    _, env = _serve(serve_stub, {"VLEMBED_BACKENDS": ""})
    assert "VLEMBED_BACKENDS" not in env


def test_serve_drops_empty_variables(serve_stub: Path) -> None:
    _, env = _serve(
        serve_stub,
        {
            "VLEMBED_MAX_QUEUE": "",
            "VLEMBED_REQUEST_TIMEOUT": "",
            "VLEMBED_PARALLEL": "4",
            "VLEMBED_API_KEY": "",
        },
    )
    assert env["VLEMBED_PARALLEL"] == "4"
    assert not {"VLEMBED_MAX_QUEUE", "VLEMBED_REQUEST_TIMEOUT", "VLEMBED_API_KEY"} & set(env)


@pytest.mark.parametrize(
    ("file_text", "env_key", "expected"),
    [
        ("s3cret\n", "", "s3cret"),
        ("s3cret", "other", "s3cret"),
        ("", "from-env", "from-env"),
        ("", "", None),
    ],
)
def test_serve_reads_the_api_key_secret(
    serve_stub: Path, file_text: str, env_key: str, expected: str | None
) -> None:
    key = serve_stub / "api_key"
    key.write_text(file_text)
    _, env = _serve(serve_stub, {"VLEMBED_API_KEY_FILE": str(key), "VLEMBED_API_KEY": env_key})
    assert env.get("VLEMBED_API_KEY") == expected
    assert "VLEMBED_API_KEY_FILE" not in env


def test_serve_refuses_unreadable_secret_and_bad_replicas(serve_stub: Path) -> None:
    proc, _ = _run(
        "serve-entrypoint.sh", serve_stub, {"VLEMBED_API_KEY_FILE": str(serve_stub / "missing")}
    )
    assert proc.returncode == 2 and "not readable" in proc.stderr
    proc, _ = _run(
        "serve-entrypoint.sh",
        serve_stub,
        {"BACKEND_SERVICE": "llama-server", "BACKEND_REPLICAS": "two"},
    )
    assert proc.returncode == 2 and "BACKEND_REPLICAS" in proc.stderr


def test_serve_entrypoint_passes_no_flags_of_its_own() -> None:
    """Everything reaches serve through its variables; flags are the caller's (SERVE_FLAGS)."""
    text = (DOCKER / "serve-entrypoint.sh").read_text()
    assert text.rstrip().endswith('exec vlembed serve "$@"')
    assert not [f for f in SERVE_FLAGS if f in text]


# --------------------------------------------------------------------------- build script


def _fake_build(tmp_path: Path, last_line: str | None = None) -> Path:
    bindir = tmp_path / "cache" / "build" / "bin"
    bindir.mkdir(parents=True)
    for exe in ("llama-server", "llama-quantize", "llama-mtmd-cli"):
        (bindir / exe).write_text("#!/bin/sh\n")
        (bindir / exe).chmod(0o755)
    (bindir / "libggml-base.so.0.9.4").write_text("lib")
    (bindir / "libggml-base.so.0").symlink_to("libggml-base.so.0.9.4")
    (bindir / "libggml-cpu-haswell.so").write_text("lib")
    (bindir / "libmtmd.so").write_text("lib")
    last = last_line if last_line is not None else str(bindir / "llama-server")
    _stub(
        tmp_path / "bin",
        "vlembed",
        RECORDER + f'echo "building with CMAKE_ARGS=$CMAKE_ARGS"\necho "{last}"\n',
    )
    return bindir


def test_build_script_collects_binaries_and_libraries(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    dest = tmp_path / "opt-llama"
    proc, rec = _run(
        "build-llama-server.sh",
        tmp_path,
        {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"},
        str(dest),
        "--cuda",
        "--jobs",
        "4",
    )
    assert proc.returncode == 0, proc.stderr
    assert rec["argv"] == ["build-server", "--cuda", "--jobs", "4"]
    assert rec["env"]["CMAKE_ARGS"] == "-DGGML_NATIVE=OFF"
    assert sorted(p.name for p in dest.iterdir()) == [
        "libggml-base.so.0",
        "libggml-base.so.0.9.4",
        "libggml-cpu-haswell.so",
        "libmtmd.so",
        "llama-quantize",
        "llama-server",
    ]
    assert (dest / "libggml-base.so.0").is_symlink()
    assert os.access(dest / "llama-server", os.X_OK)


def test_build_script_fails_when_the_last_line_is_not_the_server(tmp_path: Path) -> None:
    _fake_build(tmp_path, last_line="done")
    proc, _ = _run("build-llama-server.sh", tmp_path, {}, str(tmp_path / "dest"))
    assert proc.returncode == 1 and "not an executable" in proc.stderr


def test_build_script_fails_when_the_build_fails(tmp_path: Path) -> None:
    _stub(tmp_path / "bin", "vlembed", "#!/bin/sh\necho broken >&2\nexit 3\n")
    proc, _ = _run("build-llama-server.sh", tmp_path, {}, str(tmp_path / "dest"))
    assert proc.returncode == 3 and not (tmp_path / "dest").exists()


# ---------------------------------------------------------------------------- healthcheck


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "rc"), [(200, 0), (503, 1)])
def test_healthcheck(health_server: http.server.HTTPServer, status: int, rc: int) -> None:
    _Health.status = status
    port = str(health_server.server_address[1])
    env = {**os.environ, "VLEMBED_PORT": port, "http_proxy": "http://127.0.0.1:9"}
    proc = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == rc, proc.stderr


def test_healthcheck_fails_without_a_server(health_server: http.server.HTTPServer) -> None:
    port = str(health_server.server_address[1])
    health_server.shutdown()
    health_server.server_close()
    env = {**os.environ, "VLEMBED_PORT": port}
    proc = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "vlembed-healthcheck" in proc.stderr
