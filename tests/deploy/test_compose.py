"""compose.yaml: schema, referenced files, ports, variables, GPU variant, convert profile.

No Docker engine is needed. When a Docker Compose v2 CLI is on PATH its ``config`` (which
loads, interpolates and validates without an engine) is run too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_helpers import (
    API_PORT,
    COMPOSE_FILE,
    LLAMA_ENTRYPOINT_ENV,
    LLAMA_PORT,
    ROOT,
    SCHEMA,
    SERVE_ENTRYPOINT_ENV,
    SERVE_ENV,
    TASKS,
    VARIANTS,
    compose_cli,
    dockerfile_stages,
    environment,
    load_compose,
    load_compose_raw,
)

SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"

# Environments the file must hold up under: defaults, and everything overridden.
ENVS: dict[str, dict[str, str]] = {
    "defaults": {},
    "overridden": {
        "VLEMBED_LLAMA_REPLICAS": "3",
        "VLEMBED_PORT": "9000",
        "VLEMBED_BIND": "0.0.0.0",
        "VLEMBED_VARIANT": "Q4_K_M",
        "VLEMBED_TASK": "code",
        "VLEMBED_PARALLEL": "3",
        "VLEMBED_CTX_SIZE": "16384",
        "VLEMBED_THREADS": "8",
        "VLEMBED_GPU_COUNT": "1",
        "VLEMBED_MODELS": "/srv/vlembed/models",
        "VLEMBED_HF_DIR": "/srv/hf/jina-embeddings-v4",
        "VLEMBED_CONVERT_QUANT": "Q8_0,Q4_K_M",
        "VLEMBED_API_KEY_FILE": "./secrets/api-key",
        "VLEMBED_CUDA_VERSION": "12.6.3",
        "COMPOSE_PROJECT_NAME": "emb",
    },
}
LONG_RUNNING = ("llama-server", "api", "llama-server-gpu", "api-gpu")
BACKEND_OF = {"api": "llama-server", "api-gpu": "llama-server-gpu"}


@pytest.fixture(params=list(ENVS), scope="module")
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    return ENVS[request.param]


@pytest.fixture(scope="module")
def compose_defaults() -> dict[str, Any]:
    return load_compose()


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


# ---------------------------------------------------------------------------------- schema


def test_vendored_schema_is_intact() -> None:
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def _validator():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra")
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _errors(instance: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in _validator().iter_errors(instance)
    ]


def test_raw_file_validates_against_compose_spec() -> None:
    assert _errors(load_compose_raw()) == []


def test_interpolated_file_validates_against_compose_spec(env: dict[str, str]) -> None:
    assert _errors(load_compose(env)) == []


def test_schema_catches_mistakes() -> None:
    """The validator is live: a misspelt key and a wrong type are reported."""
    broken = load_compose()
    broken["services"]["api"]["restart_policy"] = "always"
    broken["services"]["llama-server"]["healthcheck"]["retries"] = [3]
    errors = _errors(broken)
    assert any("restart_policy" in e for e in errors), errors
    assert any("retries" in e for e in errors), errors


# ---------------------------------------------------------------------- referenced paths


def test_build_contexts_dockerfiles_and_targets_exist(env: dict[str, str]) -> None:
    _, stages = dockerfile_stages()
    for name, svc in _services(load_compose(env)).items():
        build = svc.get("build")
        assert build, f"{name}: no build section"
        context = ROOT / build.get("context", ".")
        assert context.is_dir(), f"{name}: build context {context} missing"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        assert build.get("target") in stages, f"{name}: target {build.get('target')!r}"


def _stages_built_for(target: str, stages: dict) -> set[str]:
    """The target and every stage it is built FROM or copies --from, transitively."""
    todo, seen = [target], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in stages:
            continue
        seen.add(name)
        todo.append(stages[name].base)
        for c in stages[name].of("COPY"):
            todo += [f.split("=", 1)[1] for f in c.flags if f.startswith("--from=")]
    return seen


def test_build_args_are_declared_in_the_dockerfile(compose_defaults: dict[str, Any]) -> None:
    global_args, stages = dockerfile_stages()
    for name, svc in _services(compose_defaults).items():
        build = svc["build"]
        declared = set(global_args)
        for stage in _stages_built_for(build["target"], stages):
            declared |= set(stages[stage].args())
        undeclared = set(build.get("args") or {}) - declared
        assert not undeclared, f"{name}: build args {undeclared} not declared as ARG"


def test_secret_files_exist_by_default(compose_defaults: dict[str, Any]) -> None:
    for name, secret in compose_defaults.get("secrets", {}).items():
        assert (ROOT / secret["file"]).is_file(), f"secret {name}: {secret['file']} missing"


def test_named_volumes_are_declared(env: dict[str, str]) -> None:
    compose = load_compose(env)
    declared = set(compose.get("volumes") or {})
    for name, svc in _services(compose).items():
        for spec in svc.get("volumes", []):
            source = spec.split(":", 1)[0]
            if not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: volume {source!r} not declared"


# --------------------------------------------------------------------------- models volume


def _mounts(svc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """target -> (source, mode)"""
    out = {}
    for spec in svc.get("volumes", []):
        parts = spec.split(":")
        out[parts[1]] = (parts[0], parts[2] if len(parts) > 2 else "rw")
    return out


def test_models_volume_is_shared_read_only_except_convert(env: dict[str, str]) -> None:
    services = _services(load_compose(env))
    sources = set()
    for name, svc in services.items():
        mounts = _mounts(svc)
        assert "/models" in mounts, f"{name} does not mount /models"
        source, mode = mounts["/models"]
        sources.add(source)
        assert mode == ("rw" if name == "convert" else "ro"), f"{name}: /models mode {mode}"
    assert len(sources) == 1, sources
    assert sources == {env.get("VLEMBED_MODELS", "models")}
    for name in LONG_RUNNING:
        assert environment(services[name])["VLEMBED_MODEL"] == "/models"


# ------------------------------------------------------------------------- ports and health


def test_api_port_mapping_matches_the_listening_port(env: dict[str, str]) -> None:
    services = _services(load_compose(env))
    port = env.get("VLEMBED_PORT", str(API_PORT))
    bind = env.get("VLEMBED_BIND", "127.0.0.1")
    for name in ("api", "api-gpu"):
        svc = services[name]
        assert environment(svc)["VLEMBED_PORT"] == port
        assert svc["ports"] == [f"{bind}:{port}:{port}"]
    for name in ("llama-server", "llama-server-gpu", "convert"):
        assert "ports" not in services[name], f"{name} must not publish ports"


def test_llama_server_healthcheck_probes_its_port(compose_defaults: dict[str, Any]) -> None:
    for name in ("llama-server", "llama-server-gpu"):
        test = compose_defaults["services"][name]["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] == "curl"
        assert test[-1] == f"http://127.0.0.1:{LLAMA_PORT}/health"
        assert "-f" in test[2], "curl must fail on HTTP errors (503 while loading)"


def test_api_healthcheck_probes_health(compose_defaults: dict[str, Any]) -> None:
    script = (ROOT / "docker" / "healthcheck.py").read_text()
    assert "/health" in script and "VLEMBED_PORT" in script
    _, stages = dockerfile_stages()
    copies = [c.value for c in stages["api"].of("COPY")]
    for name in ("api", "api-gpu"):
        test = compose_defaults["services"][name]["healthcheck"]["test"]
        assert test[0] == "CMD"
        assert ("docker/healthcheck.py", f"/usr/local/bin/{test[1]}") in copies


def test_long_running_services_restart_and_convert_does_not(
    compose_defaults: dict[str, Any],
) -> None:
    services = compose_defaults["services"]
    for name in LONG_RUNNING:
        assert services[name]["restart"] in ("always", "unless-stopped"), name
        assert services[name]["healthcheck"]["start_period"]
    assert services["convert"]["restart"] == "no"


# --------------------------------------------------------------------- variables and backends


def test_api_environment_is_serve_configuration(env: dict[str, str]) -> None:
    for name in ("api", "api-gpu"):
        variables = set(environment(_services(load_compose(env))[name]))
        unknown = (
            {v for v in variables if v.startswith("VLEMBED_")}
            - SERVE_ENV
            - {"VLEMBED_API_KEY_FILE"}
        )
        assert not unknown, f"{name}: {unknown} are not `vlembed serve` variables"
        others = {v for v in variables if not v.startswith("VLEMBED_")}
        assert others <= SERVE_ENTRYPOINT_ENV, others - SERVE_ENTRYPOINT_ENV


def test_llama_server_environment_is_read_by_its_entrypoint(env: dict[str, str]) -> None:
    script = (ROOT / "docker" / "llama-server-entrypoint.sh").read_text()
    for name in ("llama-server", "llama-server-gpu"):
        variables = set(environment(_services(load_compose(env))[name]))
        assert variables <= LLAMA_ENTRYPOINT_ENV, variables - LLAMA_ENTRYPOINT_ENV
        for var in variables:
            assert var in script, f"{var} is set for {name} but not read by its entrypoint"


def test_entrypoint_variables_are_all_listed() -> None:
    """The contract tables above stay in step with the scripts."""
    import re

    llama = (ROOT / "docker" / "llama-server-entrypoint.sh").read_text()
    serve = (ROOT / "docker" / "serve-entrypoint.sh").read_text()
    assert set(re.findall(r"\$\{(VLEMBED_[A-Z_]+)", llama)) == LLAMA_ENTRYPOINT_ENV
    read = set(re.findall(r"\$\{?(BACKEND_[A-Z_]+|VLEMBED_API_KEY_FILE)", serve))
    assert read == SERVE_ENTRYPOINT_ENV


def test_api_and_backends_agree(env: dict[str, str]) -> None:
    compose = load_compose(env)
    services = _services(compose)
    for api, backend in BACKEND_OF.items():
        a, b = environment(services[api]), environment(services[backend])
        for var in ("VLEMBED_MODEL", "VLEMBED_VARIANT", "VLEMBED_PARALLEL", "VLEMBED_CTX_SIZE"):
            assert a[var] == b[var], f"{api} and {backend} disagree on {var}"
        assert a["BACKEND_SERVICE"] == backend
        assert a["BACKEND_TASK"] == b["VLEMBED_TASK"] == a["VLEMBED_TASKS"]
        assert a["BACKEND_PROJECT"] == env.get("COMPOSE_PROJECT_NAME", compose["name"])
        assert int(a["BACKEND_REPLICAS"]) == int(services[backend]["deploy"]["replicas"])
        assert int(a["BACKEND_REPLICAS"]) == int(env.get("VLEMBED_LLAMA_REPLICAS", "1"))
        assert "BACKEND_PORT" not in a, "the entrypoint's default port is the llama-server port"
        assert services[api]["depends_on"] == {backend: {"condition": "service_healthy"}}
        assert a["VLEMBED_VARIANT"] in VARIANTS
        assert b["VLEMBED_TASK"] in TASKS
        assert b["VLEMBED_MMPROJ_DTYPE"] == env.get("VLEMBED_CONVERT_DTYPE", "f16")


def test_compose_defaults_are_serves_defaults(
    compose_defaults: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The llama-servers compose starts are sized like the ones serve would start."""
    try:
        from preprocess_service.serve import build_parser
    except ImportError:
        pytest.skip("preprocess_service.serve.build_parser is not importable yet")
    for var in [v for v in os.environ if v.startswith("VLEMBED_")]:
        monkeypatch.delenv(var)
    parser = build_parser()
    env = environment(compose_defaults["services"]["api"])
    assert int(env["VLEMBED_PARALLEL"]) == parser.get_default("parallel")
    assert int(env["VLEMBED_CTX_SIZE"]) == parser.get_default("ctx_size")
    assert int(env["VLEMBED_PORT"]) == parser.get_default("port") == API_PORT
    assert env["VLEMBED_VARIANT"] in [a for a in parser._actions if a.dest == "variant"][0].choices


def test_serve_entrypoint_default_backend_port_is_the_llama_port() -> None:
    script = (ROOT / "docker" / "serve-entrypoint.sh").read_text()
    llama = (ROOT / "docker" / "llama-server-entrypoint.sh").read_text()
    assert f"${{BACKEND_PORT:-{LLAMA_PORT}}}" in script
    assert f"port=${{VLEMBED_LLAMA_PORT:-{LLAMA_PORT}}}" in llama


def test_every_variable_has_a_default() -> None:
    """Interpolation with an empty environment never fails and never yields `${`."""
    text = COMPOSE_FILE.read_text()
    import re

    bare = [m for m in re.findall(r"\$\{[^}]*\}", text) if not re.search(r":?[-]", m)]
    bare = [m for m in bare if m != "${COMPOSE_PROJECT_NAME}"]
    assert not bare, f"variables without a default: {bare}"
    assert "${" not in json.dumps(load_compose({}))


# ------------------------------------------------------------------------------ GPU variant


def test_gpu_variant_reserves_nvidia_gpus(env: dict[str, str]) -> None:
    services = _services(load_compose(env))
    gpu = services["llama-server-gpu"]
    assert gpu["profiles"] == ["gpu"] and services["api-gpu"]["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [
        {"driver": "nvidia", "count": env.get("VLEMBED_GPU_COUNT", "all"), "capabilities": ["gpu"]}
    ]
    assert "resources" not in services["llama-server"].get("deploy", {})


def test_gpu_variant_builds_cuda_from_matching_images(env: dict[str, str]) -> None:
    import re

    args = _services(load_compose(env))["llama-server-gpu"]["build"]["args"]
    devel = re.fullmatch(r"nvidia/cuda:(?P<tag>[\w.]+)-devel-(?P<os>[\w.]+)", args["BUILD_IMAGE"])
    runtime = re.fullmatch(
        r"nvidia/cuda:(?P<tag>[\w.]+)-runtime-(?P<os>[\w.]+)", args["RUNTIME_IMAGE"]
    )
    assert devel and runtime, args
    assert devel.groupdict() == runtime.groupdict(), "devel and runtime images must match"
    assert devel["tag"] == env.get("VLEMBED_CUDA_VERSION", "12.8.1")
    assert "--cuda" in shlex.split(args["BUILD_SERVER_FLAGS"])
    cmake = shlex.split(args["CMAKE_ARGS"])
    assert "-DGGML_NATIVE=OFF" in cmake, "no GPU at build time: native detection must be off"
    assert any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES=") for a in cmake)


def test_cpu_build_args_default_to_the_dockerfile_defaults(
    compose_defaults: dict[str, Any],
) -> None:
    _, stages = dockerfile_stages()
    declared = stages["llama-build"].args()
    args = compose_defaults["services"]["llama-server"]["build"]["args"]
    assert args["CMAKE_ARGS"] == declared["CMAKE_ARGS"]
    assert "BUILD_IMAGE" not in args and "BUILD_SERVER_FLAGS" not in args


def test_gpu_and_cpu_images_differ(env: dict[str, str]) -> None:
    services = _services(load_compose(env))
    images = [services[n]["image"] for n in ("llama-server", "llama-server-gpu", "api", "convert")]
    assert len(set(images)) == len(images), images
    assert services["api"]["image"] == services["api-gpu"]["image"]


def _with_dependencies(services: dict[str, dict[str, Any]], target: str) -> set[str]:
    todo, seen = [target], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += list(services[name].get("depends_on") or [])
    return seen


def test_profiles_select_one_stack(compose_defaults: dict[str, Any]) -> None:
    """`up` runs the CPU pair; `up api-gpu` the GPU pair only; `run convert` convert only."""
    services = _services(compose_defaults)
    assert {n for n, s in services.items() if not s.get("profiles")} == {"api", "llama-server"}
    assert _with_dependencies(services, "api-gpu") == {"api-gpu", "llama-server-gpu"}
    assert _with_dependencies(services, "convert") == {"convert"}
    for name in _with_dependencies(services, "api-gpu"):
        assert services[name]["profiles"] == ["gpu"], "targeting api-gpu enables its profile"


# --------------------------------------------------------------------------- convert profile


def _convert_argv(compose: dict[str, Any]) -> list[str]:
    _, stages = dockerfile_stages()
    entrypoint = list(stages["convert"].of("ENTRYPOINT")[-1].value)
    assert entrypoint[0] == "vlembed"
    return entrypoint[1:] + list(compose["services"]["convert"]["command"])


def test_convert_command_parses_with_the_convert_cli(env: dict[str, str]) -> None:
    from gguf_convert.cli import build_parser
    from vlembed.constants import DTYPES, QUANT_TYPES

    compose = load_compose(env)
    argv = _convert_argv(compose)
    assert argv[0] == "convert"
    args = build_parser().parse_args(argv[1:])
    mounts = _mounts(compose["services"]["convert"])
    assert str(args.hf) in mounts and mounts[str(args.hf)][1] == "ro"
    assert str(args.out) == "/models" and mounts["/models"][1] == "rw"
    assert mounts[str(args.hf)][0] == env.get("VLEMBED_HF_DIR", "./hf")
    assert args.dtype in DTYPES
    assert args.task == "all" or set(args.task.split(",")) <= set(TASKS)
    assert {q for q in args.quant.split(",") if q} <= set(QUANT_TYPES)


def test_convert_is_one_shot_in_its_own_profile(compose_defaults: dict[str, Any]) -> None:
    convert = compose_defaults["services"]["convert"]
    assert convert["profiles"] == ["convert"]
    assert "healthcheck" not in convert and "deploy" not in convert


def test_default_variant_is_produced_by_the_default_conversion(
    compose_defaults: dict[str, Any],
) -> None:
    args = dict(zip(*[iter(_convert_argv(compose_defaults)[1:])] * 2, strict=True))
    variant = environment(compose_defaults["services"]["llama-server"])["VLEMBED_VARIANT"]
    assert variant in {args["--dtype"], *filter(None, args["--quant"].split(","))}


# ------------------------------------------------------------------------------ compose CLI


def _cli_config(
    cli: list[str],
    env: dict[str, str],
    tmp_path: Path,
    profiles: tuple[str, ...] = (),
    services: tuple[str, ...] = (),
) -> dict[str, Any]:
    run_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}
    if "VLEMBED_API_KEY_FILE" in env:  # a secret file must exist for `config` to resolve it
        key = ROOT / env["VLEMBED_API_KEY_FILE"]
        if not key.exists():
            run_env["VLEMBED_API_KEY_FILE"] = str(ROOT / "docker" / "api-key.empty")
    profile_args = [a for p in profiles for a in ("--profile", p)]
    proc = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), *profile_args, "config", "--format", "json", *services],
        cwd=ROOT,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_compose_cli_config_agrees(env: dict[str, str], tmp_path: Path) -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 CLI on PATH (`docker compose` or docker-compose >= 2)")
    real = _cli_config(cli, env, tmp_path, profiles=("gpu", "convert"))
    ours = load_compose(env)
    assert real["name"] == env.get("COMPOSE_PROJECT_NAME", ours["name"])
    assert set(real["services"]) == set(ours["services"])
    for name, svc in ours["services"].items():
        got = real["services"][name]
        assert got.get("environment", {}) == environment(svc), name
        assert got["build"]["target"] == svc["build"]["target"]
        assert got["build"].get("args", {}) == (svc["build"].get("args") or {})
        if "deploy" in svc:
            assert got["deploy"]["replicas"] == int(svc["deploy"]["replicas"])
        if name in BACKEND_OF:
            (port,) = got["ports"]
            assert (
                str(port["published"])
                == str(port["target"])
                == env.get("VLEMBED_PORT", str(API_PORT))
            )


def test_compose_cli_selects_one_stack(tmp_path: Path) -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 CLI on PATH (`docker compose` or docker-compose >= 2)")
    for services, expected in [
        ((), {"api", "llama-server"}),
        (("api-gpu",), {"api-gpu", "llama-server-gpu"}),
        (("convert",), {"convert"}),
    ]:
        real = _cli_config(cli, {}, tmp_path, services=services)
        assert set(real["services"]) == expected, services
