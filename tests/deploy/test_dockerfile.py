"""docker/Dockerfile and .dockerignore: stages, the one build path, non-root, what is copied.

Parsed with BuildKit's own Dockerfile parser (the ``dockerfile`` package); no engine needed.
"""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.deploy.deploy_helpers import (
    BUILD_SERVER_FLAGS,
    ROOT,
    Stage,
    dockerfile_stages,
    dockerignore_excludes,
    dockerignore_patterns,
    simple_commands,
)

pytest.importorskip("dockerfile", reason="the `dockerfile` parser is in the dev extra")

RUNTIME_STAGES = ("llama-server", "api", "convert")
# Commands that would mean the image builds llama.cpp by its own recipe.
COMPILERS = {"cmake", "make", "ninja", "gcc", "g++", "cc", "c++", "nvcc", "git"}


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return dockerfile_stages()[1]


@pytest.fixture(scope="module")
def global_args() -> dict[str, str | None]:
    return dockerfile_stages()[0]


def _runs(stage: Stage) -> list[str]:
    return [" ".join(c.value) for c in stage.of("RUN")]


def _commands(stage: Stage) -> list[list[str]]:
    return [cmd for run in _runs(stage) for cmd in simple_commands(run)]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_stages(stages: dict[str, Stage], global_args: dict[str, str | None]) -> None:
    assert set(stages) == {"llama-build", "llama-server", "api-build", "api", "convert"}
    assert stages["llama-build"].base == "${BUILD_IMAGE}"
    assert stages["llama-server"].base == "${RUNTIME_IMAGE}"
    assert stages["api-build"].base == stages["api"].base == "${PYTHON_IMAGE}"
    assert stages["convert"].base == "llama-build"
    assert global_args["BUILD_IMAGE"] == global_args["RUNTIME_IMAGE"] == "debian:bookworm-slim"
    assert re.fullmatch(r"python:3\.1[1-9]-slim-\w+", global_args["PYTHON_IMAGE"] or "")


def test_llama_server_is_built_by_vlembed_build_server(stages: dict[str, Stage]) -> None:
    """One build path: the image runs `vlembed build-server`, never its own cmake line."""
    build = stages["llama-build"]
    assert ["build-llama-server", "/opt/llama", "${BUILD_SERVER_FLAGS}"] == _commands(build)[-1][:3]
    copies = {c.value[-1]: c.value[0] for c in build.of("COPY")}
    assert copies["/usr/local/bin/build-llama-server"] == "docker/build-llama-server.sh"

    script = (ROOT / "docker" / "build-llama-server.sh").read_text()
    invocations = [c for c in simple_commands(script) if c[0] == "vlembed"]
    assert [c[:3] for c in invocations] == [["vlembed", "build-server", "$@"]]
    assert "build-server" in _pyproject_cli_subcommands()


def _pyproject_cli_subcommands() -> set[str]:
    from vlembed.cli import COMMANDS, build_parser

    assert _pyproject()["project"]["scripts"]["vlembed"] == "vlembed.cli:main"
    build_parser()  # the subcommand table is consistent
    return set(COMMANDS)


def test_no_stage_and_no_script_compiles_by_itself(stages: dict[str, Stage]) -> None:
    for name, stage in stages.items():
        for cmd in _commands(stage):
            assert cmd[0] not in COMPILERS, f"{name}: runs {' '.join(cmd)}"
    for script in (ROOT / "docker").glob("*.sh"):
        for cmd in simple_commands(script.read_text()):
            assert cmd[0] not in COMPILERS, f"{script.name}: runs {' '.join(cmd)}"


def test_build_server_flags_are_known(stages: dict[str, Stage]) -> None:
    """The flags compose passes through BUILD_SERVER_FLAGS / JOBS exist."""
    from tests.deploy.deploy_helpers import load_compose

    flags = {"--jobs"}  # JOBS
    for svc in load_compose()["services"].values():
        flags |= set((svc["build"].get("args") or {}).get("BUILD_SERVER_FLAGS", "").split())
    assert flags <= BUILD_SERVER_FLAGS
    try:
        from llama_patches.build import build_parser
    except ImportError:
        return  # the build script's parser is not importable yet: the spec list above stands
    known = {s for a in build_parser()._actions for s in a.option_strings}
    assert flags <= known, flags - known


def test_cmake_args_reach_the_build_script(stages: dict[str, Stage]) -> None:
    args = stages["llama-build"].args()
    assert {"CMAKE_ARGS", "BUILD_SERVER_FLAGS", "JOBS"} <= set(args)
    assert "-DGGML_NATIVE=OFF" in (args["CMAKE_ARGS"] or "").split()


def test_final_stages_run_as_numeric_non_root_user(stages: dict[str, Stage]) -> None:
    for name in RUNTIME_STAGES:
        users = stages[name].of("USER")
        assert users, f"{name}: no USER"
        user = users[-1].value[0]
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{name}: USER {user} (Kubernetes runAsNonRoot)"
        assert any(f"--uid {uid}" in run for run in _runs(stages[name])) or name == "convert"


def test_llama_server_runtime_is_small(stages: dict[str, Stage]) -> None:
    stage = stages["llama-server"]
    from_copies = [c for c in stage.of("COPY") if any(f.startswith("--from") for f in c.flags)]
    assert [(c.flags, c.value) for c in from_copies] == [
        (("--from=llama-build",), ("/opt/llama/", "/opt/llama/"))
    ]
    installed = {w for cmd in _commands(stage) if cmd[:2] == ["apt-get", "install"] for w in cmd}
    assert not installed & (COMPILERS | {"python3", "cmake"}), installed
    script = (ROOT / "docker" / "build-llama-server.sh").read_text()
    assert "llama-server llama-quantize" in script and "lib*.so*" in script


def test_api_image_installs_base_dependencies_only(stages: dict[str, Stage]) -> None:
    for name in ("api-build", "api"):
        for cmd in _commands(stages[name]):
            assert "torch" not in " ".join(cmd), f"{name}: {cmd}"
            if "pip" in cmd[0] and "install" in cmd:
                assert cmd[-1] == ".", f"{name}: installs {cmd[-1]} (base install is '.')"
    assert [c.value for c in stages["api"].of("COPY") if c.flags == ("--from=api-build",)] == [
        ("/opt/venv", "/opt/venv")
    ]


def test_convert_image_has_the_convert_extra(stages: dict[str, Stage]) -> None:
    installs = [cmd for cmd in _commands(stages["convert"]) if "install" in cmd]
    assert any(".[convert]" in cmd for cmd in installs), installs
    assert "convert" in _pyproject()["project"]["optional-dependencies"]
    assert list(stages["convert"].of("ENTRYPOINT")[-1].value) == ["vlembed", "convert"]
    assert "convert" in _pyproject_cli_subcommands()


def test_every_package_is_copied_where_it_is_installed(stages: dict[str, Stage]) -> None:
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    needed = packages | {"pyproject.toml", "README.md"}
    for name in ("llama-build", "api-build"):
        copied = {src.rstrip("/") for c in stages[name].of("COPY") for src in c.value[:-1]}
        assert needed <= copied, f"{name} misses {needed - copied}"


def test_copy_sources_exist_and_are_in_the_build_context(stages: dict[str, Stage]) -> None:
    patterns = dockerignore_patterns()
    for name, stage in stages.items():
        for c in stage.of("COPY"):
            if any(f.startswith("--from") for f in c.flags):
                continue
            for src in c.value[:-1]:
                path = ROOT / src
                assert path.exists(), f"{name}: COPY {src} missing"
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    if "__pycache__" in rel:
                        continue
                    assert not dockerignore_excludes(rel, patterns), f"{rel} is .dockerignored"


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = dockerignore_patterns()
    for rel in (
        ".git/config",
        ".venv/bin/python",
        "models/text-retrieval-f16.gguf",
        "hf/a",
        "tests/deploy/test_compose.py",
        "preprocess_service/__pycache__/x.pyc",
    ):
        assert dockerignore_excludes(rel, patterns), rel
    for rel in ("pyproject.toml", "vlembed/cli.py", "docker/serve-entrypoint.sh"):
        assert not dockerignore_excludes(rel, patterns), rel


def test_entrypoints_and_healthchecks(stages: dict[str, Stage]) -> None:
    expected = {
        "llama-server": ("vlembed-llama-server", "docker/llama-server-entrypoint.sh", "8080"),
        "api": ("vlembed-serve", "docker/serve-entrypoint.sh", "8000"),
    }
    for name, (entry, script, port) in expected.items():
        stage = stages[name]
        assert list(stage.of("ENTRYPOINT")[-1].value) == [entry]
        copies = {c.value[-1]: (c.value[0], c.flags) for c in stage.of("COPY")}
        assert copies[f"/usr/local/bin/{entry}"] == (script, ("--chmod=0755",))
        assert list(stage.of("EXPOSE")[-1].value) == [port]
        assert stage.of("HEALTHCHECK"), f"{name}: no HEALTHCHECK"
    env = dict(zip(*[iter(stages["api"].of("ENV")[-1].value)] * 2, strict=True))
    assert env["VLEMBED_HOST"] == "0.0.0.0" and env["VLEMBED_PORT"] == "8000"
    assert env["VLEMBED_MODEL"] == "/models"


def test_scripts_are_executable_posix_sh() -> None:
    for script in (ROOT / "docker").glob("*.sh"):
        assert script.read_text().startswith("#!/bin/sh\n"), script.name
        assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
