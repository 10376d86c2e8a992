"""docs/deploy.md stays true: its commands use real flags, its variables exist, its sizing
table is the arithmetic it claims, and the `vlembed serve` parser (once it exists) has every
flag the deployment relies on."""

from __future__ import annotations

import re

import pytest

from tests.deploy.deploy_helpers import (
    BUILD_SERVER_FLAGS,
    COMPOSE_FILE,
    DEPLOY_DOC,
    KV_PER_TOKEN,
    LLAMA_ENTRYPOINT_ENV,
    LLAMA_FLAG_ALIASES,
    LLAMA_SERVER_FLAGS,
    SERVE_ENTRYPOINT_ENV,
    SERVE_ENV,
    SERVE_FLAGS,
    TASKS,
    VARIANTS,
    compose_variables,
    load_compose_raw,
    simple_commands,
    weight_bytes,
)

DOC = DEPLOY_DOC.read_text()


def _code_commands() -> list[list[str]]:
    """Simple commands of every fenced shell block, env prefixes dropped."""
    blocks = re.findall(r"```(?:bash|sh|console)\n(.*?)```", DOC, re.S)
    return [cmd for block in blocks for cmd in simple_commands(block)]


def _invocations(*prefix: str) -> list[list[str]]:
    n = len(prefix)
    found = [cmd[n:] for cmd in _code_commands() if tuple(cmd[:n]) == prefix]
    assert found, f"docs/deploy.md shows no `{' '.join(prefix)}` command"
    return found


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("-")]


def _serve_parser_flags() -> set[str] | None:
    try:
        from preprocess_service.serve import build_parser
    except ImportError:
        return None
    return {s for action in build_parser()._actions for s in action.option_strings}


# ------------------------------------------------------------------------- the serve parser


def test_serve_parser_has_every_flag_of_the_contract() -> None:
    flags = _serve_parser_flags()
    if flags is None:
        pytest.skip("preprocess_service.serve.build_parser is not importable yet")
    assert set(SERVE_FLAGS) <= flags, set(SERVE_FLAGS) - flags


def test_serve_parser_flag_shapes() -> None:
    """--backend repeats and accumulates; --allow-url-fetch takes no value."""
    try:
        from preprocess_service.serve import build_parser
    except ImportError:
        pytest.skip("preprocess_service.serve.build_parser is not importable yet")
    actions = {s: a for a in build_parser()._actions for s in a.option_strings}
    assert actions["--allow-url-fetch"].nargs == 0
    ns = build_parser().parse_args(
        ["--model", "m", "--backend", "http://a:8080", "--backend", "code=http://b:8080"]
    )
    value = getattr(ns, actions["--backend"].dest)
    flat = [v for item in value for v in (item if isinstance(item, list) else [item])]
    assert [str(v) for v in flat][-2:] == ["http://a:8080", "code=http://b:8080"] or {
        "http://a:8080",
        "code=http://b:8080",
    } <= {str(v) for v in flat}, value


# ---------------------------------------------------------------------------- doc commands


def test_serve_commands_use_real_flags() -> None:
    parser_flags = _serve_parser_flags()
    for args in _invocations("vlembed", "serve"):
        flags = set(_flags(args))
        assert flags <= set(SERVE_FLAGS), flags - set(SERVE_FLAGS)
        if parser_flags is not None:
            assert flags <= parser_flags, flags - parser_flags
        for value in (args[i + 1] for i, a in enumerate(args) if a == "--variant"):
            assert value in VARIANTS
        for value in (args[i + 1] for i, a in enumerate(args) if a == "--tasks"):
            assert set(value.split(",")) <= set(TASKS)


def test_convert_commands_parse() -> None:
    from gguf_convert.cli import build_parser

    for args in _invocations("vlembed", "convert"):
        build_parser().parse_args(args)


def test_build_server_commands_use_real_flags() -> None:
    for args in _invocations("vlembed", "build-server"):
        assert set(_flags(args)) <= BUILD_SERVER_FLAGS


def test_llama_server_commands_match_the_entrypoint() -> None:
    for args in _invocations("llama-server"):
        args = [LLAMA_FLAG_ALIASES.get(a, a) for a in args]
        values = dict(zip(args, args[1:], strict=False))
        # -t and --no-repack depend on the machine and the variant
        assert set(_flags(args)) | {"-t", "--no-repack"} == set(LLAMA_SERVER_FLAGS)
        assert int(values["-c"]) == int(values["-np"]) * int(values["-ub"])
        assert values["-ub"] == values["-b"]
        assert values["--pooling"] == "none"


def test_compose_commands_name_real_services() -> None:
    raw = load_compose_raw()
    services = set(raw["services"])
    profiles = {p for s in raw["services"].values() for p in s.get("profiles", [])}
    for args in _invocations("docker", "compose"):
        words = [a for a in args if not a.startswith("-")]
        sub, rest = words[0], words[1:]
        if sub in ("up", "run"):
            assert set(rest) <= services, set(rest) - services
        for i, a in enumerate(args):
            if a == "--profile":
                assert args[i + 1] in profiles
            if a.startswith("--scale"):
                assert args[i + 1].split("=")[0] in services


def test_docker_build_targets_exist() -> None:
    from tests.deploy.deploy_helpers import dockerfile_stages

    pytest.importorskip("dockerfile", reason="the `dockerfile` parser is in the dev extra")
    stages = dockerfile_stages()[1]
    global_args = dockerfile_stages()[0]
    for args in _invocations("docker", "build"):
        target = args[args.index("--target") + 1]
        assert target in stages
        for i, a in enumerate(args):
            if a == "--build-arg":
                name = args[i + 1].split("=", 1)[0]
                assert name in global_args or any(name in s.args() for s in stages.values())


# ------------------------------------------------------------------------------- variables


def test_every_variable_in_the_doc_exists() -> None:
    compose_vars = compose_variables(COMPOSE_FILE.read_text())
    known = (
        SERVE_ENV | compose_vars | LLAMA_ENTRYPOINT_ENV | SERVE_ENTRYPOINT_ENV | {"VLEMBED_CACHE"}
    )
    mentioned = set(re.findall(r"\bVLEMBED_[A-Z0-9_]*[A-Z0-9]\b", DOC))
    assert mentioned <= known, mentioned - known


def test_every_compose_variable_is_documented() -> None:
    compose_vars = compose_variables(COMPOSE_FILE.read_text()) - {"COMPOSE_PROJECT_NAME"}
    undocumented = {v for v in compose_vars if f"`{v}`" not in DOC}
    assert not undocumented, undocumented


def test_every_serve_flag_is_documented() -> None:
    for flag, var in SERVE_FLAGS.items():
        assert f"`{flag}" in DOC, flag
        if var:
            assert f"`{var}`" in DOC, var


# ---------------------------------------------------------------------------------- sizing


def _expected_row(variant: str) -> list[str]:
    text, mmproj, host = weight_bytes(variant)
    kv = KV_PER_TOKEN * 8192
    cells = [text, mmproj, kv, text + mmproj + kv, host]
    return [variant] + [f"{c / 1e9:.2f}" for c in cells]


def test_sizing_table_is_the_stated_arithmetic() -> None:
    assert "Computed, not measured" in DOC
    rows = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in VARIANTS and len(cells) == 6:
            rows[cells[0]] = cells
    assert set(rows) == set(VARIANTS)
    for variant in VARIANTS:
        assert rows[variant] == _expected_row(variant), variant
    assert f"{KV_PER_TOKEN:,} B per token" in DOC


def _serve_defaults(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    try:
        from preprocess_service.serve import build_parser
    except ImportError:
        pytest.skip("preprocess_service.serve.build_parser is not importable yet")
    for var in [v for v in __import__("os").environ if v.startswith("VLEMBED_")]:
        monkeypatch.delenv(var)
    parser = build_parser()
    return {s: parser.get_default(a.dest) for a in parser._actions for s in a.option_strings}


@pytest.mark.parametrize(
    "flag", ["--port", "--parallel", "--ctx-size", "--max-queue", "--request-timeout"]
)
def test_documented_serve_defaults_are_the_parser_defaults(
    flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = _serve_defaults(monkeypatch)
    m = re.search(rf"\| `{flag}[^`]*` \| [^|]*\| (\d+)", DOC)
    assert m, f"no default documented for {flag}"
    assert float(m.group(1)) == float(defaults[flag])
