"""Fetch the pinned llama.cpp, apply this package's patch series and build llama-server.

``vlembed build-server [--cuda] [--jobs N]`` prints the path of the patched llama-server as its
last line. The other parts of the project import the functions below: the converter needs the
*unpatched* tree (``pristine_source()``: convert_hf_to_gguf.py, gguf-py, models/ggml-vocab-*),
the service and the tests need the binaries (``server_binary()``, ``quantize_binary()``).

Why a source build: the patches (precomputed patch rows, every prompt row as a binary body, no LM
head in embedding mode; see README.md here) are not in any released llama.cpp, and the llama.cpp
revision is pinned through the sdist of ``llama-cpp-python`` (PIN), which vendors the full tree.
Builds are cached outside the repository, keyed by pin + patch-series hash (+ CUDA, + extra cmake
arguments), so a second call is a marker-file check and editing a patch triggers a new build.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from vlembed.paths import cache_root

PIN = "llama-cpp-python==0.3.36"
"""The PyPI sdist whose vendor/llama.cpp is the llama.cpp revision the patches are made for."""

UPSTREAM_COMMIT = "0c1e57098"
"""ggml-org/llama.cpp commit vendored by PIN (informational; the sdist is what gets fetched)."""

SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
_SDIST_TOP = "llama_cpp_python-0.3.36"
_VENDOR_PREFIX = f"{_SDIST_TOP}/vendor/llama.cpp/"

TARGETS = ("llama-server", "llama-quantize", "llama-mtmd-cli")
"""Built targets: the server, the quantizer (GGUF quantisation) and the mtmd CLI (debugging)."""

BASE_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    # self-contained binaries: no RUNPATH into the build tree, so they can be copied (containers)
    "-DBUILD_SHARED_LIBS=OFF",
)

_MARKER = "BUILD_OK.json"
# not needed to build; the converter reads models/ from the pristine tree
_COPY_IGNORE = ("models", "docs", ".git")


def _top_level_ignore(root: Path):
    """copytree ignore callable that skips _COPY_IGNORE in the tree root only."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        return set(_COPY_IGNORE) & set(names) if Path(directory) == root else set()

    return ignore


class BuildError(RuntimeError):
    """A step of fetching, patching or building failed; the message says which and why."""


def _pin_slug() -> str:
    return PIN.replace("==", "-").replace("/", "_")


def patch_files() -> list[Path]:
    """The patch series, in application order (sorted ``*.patch`` next to this file)."""
    return sorted(Path(__file__).resolve().parent.glob("*.patch"))


def patch_hash() -> str:
    """Short sha256 over the series (names and contents), used to key the build directory."""
    h = hashlib.sha256()
    for p in patch_files():
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:12]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock so concurrent callers (tests, the service, a shell) don't build twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX: best effort, no lock
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"[build-server] {msg}", file=sys.stderr, flush=True)


def _stderr_fd() -> int | None:
    """The OS file descriptor behind ``sys.stderr``, or None when it has none.

    Under pytest's ``capsys``, in a Jupyter kernel or with a replaced ``sys.stderr`` (an
    ``io.StringIO``), ``fileno()`` raises or there is no stream at all; a subprocess cannot write
    there directly.
    """
    stream = sys.stderr
    if stream is None:
        return None
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _run_to_stderr(cmd: Sequence[str], cwd: Path | None = None) -> int:
    """Run ``cmd`` with its stdout and stderr going to ``sys.stderr``; return its exit code.

    When ``sys.stderr`` has a real file descriptor the child writes to it directly (progress
    bars and compiler output appear as they happen). Otherwise the output is piped and copied
    line by line to ``sys.stderr.write`` (or dropped if there is no ``sys.stderr``).
    """
    stream = sys.stderr
    fd = _stderr_fd()
    if fd is not None:
        stream.flush()  # what Python buffered comes before the child's output
        return subprocess.run(list(cmd), cwd=cwd, stdout=fd, stderr=fd).returncode
    with subprocess.Popen(
        list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if stream is not None:
                stream.write(line.decode("utf-8", errors="replace"))
        if stream is not None:
            stream.flush()
    return proc.returncode


def _fetch_sdist(dest_dir: Path) -> Path:
    """The pinned sdist in dest_dir, downloaded with pip if it is not there yet."""
    sdist = dest_dir / SDIST_NAME
    if sdist.is_file():
        return sdist
    dest_dir.mkdir(parents=True, exist_ok=True)
    _log(f"downloading {PIN} sdist (~77 MB) with pip")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--dest",
        str(dest_dir),
        PIN,
    ]
    returncode = _run_to_stderr(cmd)
    if returncode != 0 or not sdist.is_file():
        raise BuildError(
            f"could not download {PIN}: `{shlex.join(cmd)}` exited {returncode}; "
            f"put {SDIST_NAME} into {dest_dir} to build offline"
        )
    return sdist


def _extract_vendor(sdist: Path, dest: Path) -> None:
    """Extract vendor/llama.cpp of the sdist into dest (a fresh directory)."""
    dest.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(_VENDOR_PREFIX):
                continue
            m.name = m.name[len(_VENDOR_PREFIX) :]
            if m.name:
                members.append(m)
        if not members:
            raise BuildError(f"{sdist} holds no {_VENDOR_PREFIX}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(dest, members=members)


def pristine_source() -> Path:
    """The unpatched llama.cpp tree of PIN (extracted once into the cache, keyed by pin).

    Uses ``<cache>/sdist/llama_cpp_python-0.3.36.tar.gz`` (or the same file directly in the cache
    root) when present, otherwise downloads it with pip. Never modified afterwards: the converter
    runs its convert_hf_to_gguf.py / gguf-py and reads models/ggml-vocab-qwen2.gguf.
    """
    root = cache_root()
    src = root / "src" / _pin_slug() / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    with _file_lock(root / "locks" / f"src-{_pin_slug()}.lock"):
        if (src / "CMakeLists.txt").is_file():
            return src
        sdist = root / SDIST_NAME
        if not sdist.is_file():
            sdist = _fetch_sdist(root / "sdist")
        _log(f"extracting vendor/llama.cpp from {sdist.name}")
        src.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=src.parent))
        try:
            _extract_vendor(sdist, tmp / "llama.cpp")
            if src.exists():
                shutil.rmtree(src)
            (tmp / "llama.cpp").rename(src)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return src


def _find_tools(need_cuda: bool) -> dict[str, str]:
    """cmake, a C++ compiler and a patch tool, or a BuildError that says what to install.

    The compiler is only checked here; cmake picks it itself ($CXX or the system default).
    """
    tools: dict[str, str] = {}
    cmake = shutil.which("cmake")
    if not cmake:
        raise BuildError(
            "cmake not found on PATH: install cmake >= 3.14 (e.g. apt-get install "
            "cmake, or pip install cmake)"
        )
    tools["cmake"] = cmake
    cxx = os.environ.get("CXX") or next(
        (c for c in ("c++", "g++", "clang++") if shutil.which(c)), None
    )
    if not cxx or not shutil.which(shlex.split(cxx)[0]):
        raise BuildError(
            "no C++ compiler found (looked at $CXX, c++, g++, clang++): install one, "
            "e.g. apt-get install build-essential"
        )
    tools["cxx"] = cxx
    if shutil.which("git"):
        tools["apply"] = "git"
    elif shutil.which("patch"):
        tools["apply"] = "patch"
    else:
        raise BuildError("neither git nor patch found: one of them is needed to apply the series")
    if need_cuda and not (shutil.which("nvcc") or os.environ.get("CUDACXX")):
        raise BuildError("--cuda needs the CUDA toolkit: nvcc not on PATH and $CUDACXX unset")
    return tools


def _apply_series(tree: Path, tool: str) -> None:
    for p in patch_files():
        if tool == "git":
            cmd = ["git", "apply", "--whitespace=nowarn", str(p)]
        else:
            cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(p)]
        # keep git from treating an enclosing repository (e.g. a cache inside a checkout) as the
        # work tree: it would resolve the patch paths against that repository's root
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
        res = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise BuildError(
                f"patch {p.name} does not apply to {PIN} "
                f"(`{shlex.join(cmd)}`):\n{res.stdout}{res.stderr}"
            )
        _log(f"applied {p.name}")


def _extra_cmake_args(cmake_args: Sequence[str] | None) -> list[str]:
    return shlex.split(os.environ.get("CMAKE_ARGS", "")) + list(cmake_args or [])


def build_dir_for(cuda: bool = False, cmake_args: Sequence[str] | None = None) -> Path:
    """The cache directory of a build: pin + patch hash (+ cuda) (+ hash of extra cmake args)."""
    key = f"{_pin_slug()}-{patch_hash()}" + ("-cuda" if cuda else "")
    extra = _extra_cmake_args(cmake_args)
    if extra:
        key += "-" + hashlib.sha256("\0".join(extra).encode()).hexdigest()[:8]
    return cache_root() / "build" / key


def _run_streamed(cmd: list[str], cwd: Path | None = None) -> None:
    """Run a build step with its output on stderr (progress), failing with the step named."""
    _log(shlex.join(cmd))
    returncode = _run_to_stderr(cmd, cwd=cwd)
    if returncode != 0:
        raise BuildError(
            f"`{shlex.join(cmd)}` failed with exit code {returncode} (see the output above)"
        )


def build_server(
    cuda: bool = False, jobs: int | None = None, cmake_args: Sequence[str] | None = None
) -> Path:
    """Build the patched binaries (if needed) and return the directory that holds them.

    Idempotent and cheap when done: a marker file written after a successful build makes the
    next call return at once. Concurrent callers serialise on a file lock; the loser finds the
    marker and returns. Extra cmake arguments come from $CMAKE_ARGS and ``cmake_args``.
    """
    base = build_dir_for(cuda, cmake_args)
    bin_dir = base / "build" / "bin"
    marker = base / _MARKER

    def done() -> bool:
        return marker.is_file() and all((bin_dir / t).is_file() for t in TARGETS)

    if done():
        return bin_dir

    with _file_lock(base.parent / f"{base.name}.lock"):
        if done():
            return bin_dir
        tools = _find_tools(cuda)
        start = time.monotonic()
        src = _patched_copy(base, tools["apply"])
        configure = _cmake_build(tools["cmake"], src, base / "build", cuda, cmake_args, jobs)
        missing = [t for t in TARGETS if not (bin_dir / t).is_file()]
        if missing:
            raise BuildError(f"build finished but {', '.join(missing)} not found in {bin_dir}")
        record = {
            "pin": PIN,
            "upstream_commit": UPSTREAM_COMMIT,
            "patch_hash": patch_hash(),
            "patches": [p.name for p in patch_files()],
            "cuda": cuda,
            "cmake_args": configure[5:],
            "seconds": round(time.monotonic() - start, 1),
        }
        marker.write_text(json.dumps(record, indent=2) + "\n")
        _log(f"built {', '.join(TARGETS)} in {time.monotonic() - start:.0f} s")
    return bin_dir


def _patched_copy(base: Path, apply_tool: str) -> Path:
    """A fresh patched copy of the pristine tree at ``base/src``.

    Fresh every time a build is (re)started: a half-patched tree from an interrupted run must
    never be built.
    """
    pristine = pristine_source()
    src = base / "src"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    _log(f"copying {pristine} -> {src}")
    shutil.copytree(pristine, src, ignore=_top_level_ignore(pristine), symlinks=True)
    _apply_series(src, apply_tool)
    return src


def _cmake_build(
    cmake: str,
    src: Path,
    build: Path,
    cuda: bool,
    cmake_args: Sequence[str] | None,
    jobs: int | None,
) -> list[str]:
    """Configure and build ``TARGETS``; return the configure command (recorded in the marker)."""
    configure = [cmake, "-S", str(src), "-B", str(build), *BASE_CMAKE_ARGS]
    if cuda:
        configure.append("-DGGML_CUDA=ON")
    configure += _extra_cmake_args(cmake_args)
    _run_streamed(configure)
    n_jobs = jobs or os.cpu_count() or 1
    _run_streamed(
        [
            cmake,
            "--build",
            str(build),
            "--config",
            "Release",
            "-j",
            str(n_jobs),
            "--target",
            *TARGETS,
        ]
    )
    return configure


def server_binary(cuda: bool = False) -> Path:
    """Path of the patched llama-server, building it first if needed."""
    return build_server(cuda=cuda) / "llama-server"


def quantize_binary(cuda: bool = False) -> Path:
    """Path of llama-quantize from the same build (the converter quantises with it)."""
    return build_server(cuda=cuda) / "llama-quantize"


def main(argv: list[str] | None = None) -> int:
    """``vlembed build-server``: build (or find) the patched llama-server and print its path."""
    parser = argparse.ArgumentParser(
        prog="vlembed build-server",
        description=f"Fetch {PIN} (llama.cpp {UPSTREAM_COMMIT}), apply the vlembed patch "
        "series and build llama-server, llama-quantize and llama-mtmd-cli. "
        "Extra cmake arguments are read from $CMAKE_ARGS; the cache directory is "
        "$VLEMBED_CACHE (default ~/.cache/vlembed). Prints the llama-server path last.",
    )
    parser.add_argument("--cuda", action="store_true", help="build with -DGGML_CUDA=ON")
    parser.add_argument(
        "--jobs", "-j", type=int, default=None, help="parallel build jobs (default: all CPUs)"
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be >= 1")
    try:
        bin_dir = build_server(cuda=args.cuda, jobs=args.jobs)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(bin_dir / "llama-server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
