"""Shared by the deployment tests: the CLI contract, compose interpolation, Dockerfile stages.

Nothing here needs a Docker engine. The contract tables below are what compose.yaml, the
Dockerfile, the entrypoint scripts and docs/deploy.md are checked against; when the real
parsers are importable (``preprocess_service.serve.build_parser``, ``gguf_convert.cli``) the
tests check those too.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKER = ROOT / "docker"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
SCHEMA = Path(__file__).resolve().parent / "data" / "compose-spec.json"

# `vlembed serve` flags and the environment variable each one reads (None: flag only).
SERVE_FLAGS: dict[str, str | None] = {
    "--model": "VLEMBED_MODEL",
    "--host": "VLEMBED_HOST",
    "--port": "VLEMBED_PORT",
    "--backend": "VLEMBED_BACKENDS",
    "--api-key": "VLEMBED_API_KEY",
    "--parallel": "VLEMBED_PARALLEL",
    "--threads": "VLEMBED_THREADS",
    "--variant": "VLEMBED_VARIANT",
    "--flash-attn": "VLEMBED_FLASH_ATTN",
    "--mmproj-variant": "VLEMBED_MMPROJ_VARIANT",
    "--repack": "VLEMBED_REPACK",
    "--vision-batch-tokens": "VLEMBED_VISION_BATCH_TOKENS",
    "--patch-transport": "VLEMBED_PATCH_TRANSPORT",
    "--tasks": "VLEMBED_TASKS",
    "--ctx-size": "VLEMBED_CTX_SIZE",
    "--max-queue": "VLEMBED_MAX_QUEUE",
    "--request-timeout": "VLEMBED_REQUEST_TIMEOUT",
    "--allow-url-fetch": "VLEMBED_ALLOW_URL_FETCH",
    "--allow-file-dir": "VLEMBED_ALLOW_FILE_DIR",
}
SERVE_ENV = frozenset(v for v in SERVE_FLAGS.values() if v)
VARIANTS = ("f32", "f16", "bf16", "Q8_0", "Q4_K_M", "IQ4_XS")
TASKS = ("retrieval", "text-matching", "code")
BUILD_SERVER_FLAGS = frozenset({"--cuda", "--jobs"})

# How the patched llama-server is started (by serve or by compose): flag -> takes a value.
# -c is the context of all slots; -b and -ub are one slot's (an embedding prompt must fit in one
# micro-batch). -t is left to llama-server unless threads are configured.
LLAMA_SERVER_FLAGS: dict[str, bool] = {
    "-m": True,
    "--mmproj": True,
    "--embeddings": False,
    "--pooling": True,
    "--host": True,
    "--port": True,
    "-np": True,
    "-t": True,
    "-c": True,
    "-b": True,
    "-ub": True,
    "--no-kv-unified": False,
    "--no-webui": False,
    "-fa": True,
    "--mmproj-flash-attn": True,
    "--no-repack": False,
    "--mtmd-batch-max-tokens": True,
    "--image-max-tokens": True,
}
LLAMA_FLAG_ALIASES = {
    "--batch-size": "-b",
    "--ubatch-size": "-ub",
    "--parallel": "-np",
    "--threads": "-t",
    "--ctx-size": "-c",
    "--model": "-m",
}

# Variables read inside the containers by docker/*.sh (not serve's own).
LLAMA_ENTRYPOINT_ENV = frozenset(
    {
        "VLEMBED_MODEL",
        "VLEMBED_TASK",
        "VLEMBED_VARIANT",
        "VLEMBED_FLASH_ATTN",
        "VLEMBED_REPACK",
        "VLEMBED_VISION_BATCH_TOKENS",
        "VLEMBED_MMPROJ_DTYPE",
        "VLEMBED_PARALLEL",
        "VLEMBED_CTX_SIZE",
        "VLEMBED_THREADS",
        "VLEMBED_LLAMA_PORT",
    }
)
SERVE_ENTRYPOINT_ENV = frozenset(
    {
        "VLEMBED_API_KEY_FILE",
        "BACKEND_SERVICE",
        "BACKEND_REPLICAS",
        "BACKEND_PROJECT",
        "BACKEND_PORT",
        "BACKEND_TASK",
    }
)
LLAMA_PORT = 8080  # inside the llama-server containers
API_PORT = 8000  # serve's default port


# ------------------------------------------------------------------------------------------
# compose interpolation (the subset of the Compose Specification that compose.yaml may use)


class InterpolationError(ValueError):
    """A ``${VAR:?message}`` whose variable is missing, or malformed ``$`` syntax."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.S)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Expand ``$$``, ``$VAR``, ``${VAR}``, ``${VAR[:]-default}``, ``${VAR[:]?err}``,
    ``${VAR[:]+alt}`` as Compose does; defaults may nest."""
    out: list[str] = []
    i = 0
    while i < len(value):
        c = value[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if value.startswith("${", i):
            depth, j = 0, i + 1
            while j < len(value):
                if value[j] == "{":
                    depth += 1
                elif value[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            else:
                raise InterpolationError(f"unterminated ${{ in {value!r}")
            out.append(_expand(value[i + 2 : j], env))
            i = j + 1
            continue
        m = _NAME.match(value, i + 1)
        if not m:
            raise InterpolationError(f"invalid '$' at {i} in {value!r} (use $$ for a literal $)")
        out.append(env.get(m.group(), ""))
        i = m.end()
    return "".join(out)


def _expand(expr: str, env: dict[str, str]) -> str:
    m = _BRACED.fullmatch(expr)
    if not m:
        raise InterpolationError(f"invalid interpolation ${{{expr}}}")
    name, op, arg = m.group("name"), m.group("op"), m.group("arg")
    val = env.get(name)
    if op is None:
        return val or ""
    alt = interpolate(arg, env)
    if op == ":-":
        return val if val else alt
    if op == "-":
        return val if val is not None else alt
    if op in (":?", "?"):
        if (op == ":?" and not val) or val is None:
            raise InterpolationError(f"{name}: {alt}")
        return val
    if op == ":+":
        return alt if val else ""
    return alt if val is not None else ""  # "+"


def interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(v, env) for v in node]
    return node


def compose_variables(text: str) -> set[str]:
    """Names of the variables compose.yaml interpolates."""
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def load_compose_raw() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra")

    return yaml.safe_load(COMPOSE_FILE.read_text())


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml with YAML merge keys resolved and variables interpolated from ``env``."""
    raw = load_compose_raw()
    env = dict(env or {})
    env.setdefault("COMPOSE_PROJECT_NAME", raw.get("name", ROOT.name))
    return interpolate_tree(raw, env)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


# ------------------------------------------------------------------------------------------
# Docker Compose v2 CLI (optional; `config` needs no engine)


def compose_cli() -> list[str] | None:
    """``docker compose`` or a ``docker-compose`` binary of version 2 or later, else None."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cmd in candidates:
        try:
            proc = subprocess.run(
                [*cmd, "version", "--short"], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.match(r"v?(\d+)\.", proc.stdout.strip())
        if proc.returncode == 0 and m and int(m.group(1)) >= 2:
            return cmd
    return None


# ------------------------------------------------------------------------------------------
# Dockerfile


@dataclass
class Stage:
    name: str
    base: str
    commands: list[Any] = field(default_factory=list)  # dockerfile.Command

    def of(self, instruction: str) -> list[Any]:
        return [c for c in self.commands if c.cmd.upper() == instruction]

    def args(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for c in self.of("ARG"):
            for item in c.value:
                name, _, default = item.partition("=")
                out[name] = _unquote(default) if "=" in item else None
        return out


def _unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'" else s


def dockerfile_stages(path: Path = DOCKERFILE) -> tuple[dict[str, str | None], dict[str, Stage]]:
    """(global ARGs, stages by name) parsed with BuildKit's own parser."""
    dockerfile = pytest.importorskip("dockerfile", reason="the `dockerfile` parser is in dev")

    global_args: dict[str, str | None] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for c in dockerfile.parse_file(str(path)):
        if c.cmd.upper() == "FROM":
            words = list(c.value)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages[name] = Stage(name=name, base=words[0])
        elif current is None:
            if c.cmd.upper() == "ARG":
                for item in c.value:
                    key, _, default = item.partition("=")
                    global_args[key] = _unquote(default) if "=" in item else None
        else:
            current.commands.append(c)
    return global_args, stages


_SEPARATORS = re.compile(r"&&|\|\||;|\||\n")


def simple_commands(script: str) -> list[list[str]]:
    """Split a shell snippet into simple commands (word lists), dropping VAR=value prefixes.

    Good enough for the straight-line RUN lines and scripts of this repository; compound
    statements (if/for/case) come out as their own words, which is what the checks need.
    """
    out = []
    for part in _SEPARATORS.split(script.replace("\\\n", " ")):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            words = part.split()
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words.pop(0)
        if words:
            out.append(words)
    return out


def dockerignore_excludes(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (a path relative to the context) is excluded; last matching rule wins.

    Implements the rules .dockerignore uses here: ``*``/``?`` within one component, ``**``
    across components, ``!`` re-includes, a pattern also matches everything below a match.
    """
    import fnmatch

    def matches(pattern: str, path: str) -> bool:
        pattern = pattern.strip("/")
        parts, pats = path.split("/"), pattern.split("/")

        def rec(pi: int, si: int) -> bool:
            if pi == len(pats):
                return True  # a match of a prefix covers everything below it
            if pats[pi] == "**":
                return any(rec(pi + 1, k) for k in range(si, len(parts) + 1))
            return (
                si < len(parts) and fnmatch.fnmatchcase(parts[si], pats[pi]) and rec(pi + 1, si + 1)
            )

        return rec(0, 0)

    excluded = False
    for line in patterns:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if matches(line[1:] if negate else line, rel):
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    return DOCKERIGNORE.read_text().splitlines()


# ------------------------------------------------------------------------------------------
# docker/*.sh run for real against stub programs that record their argv and environment

RECORDER = """#!/bin/sh
python3 - "$0" "$@" <<'EOF'
import json, os, sys
with open(os.environ["STUB_RECORD"], "w") as f:
    json.dump({"argv": sys.argv[2:], "env": dict(os.environ)}, f)
EOF
"""


def stub_program(bin_dir: Path, name: str, body: str = RECORDER) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run_docker_script(
    script: str, tmp_path: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """Run docker/<script> with ``tmp_path/bin`` first on PATH; (process, what a stub recorded)."""
    record = tmp_path / "record.json"
    record.unlink(missing_ok=True)
    full_env = {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "STUB_RECORD": str(record),
        **env,
    }
    proc = subprocess.run(
        ["sh", str(DOCKER / script), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    recorded = json.loads(record.read_text()) if record.exists() else None
    return proc, recorded


def llama_server_flags(argv: list[str]) -> dict[str, str | bool]:
    """llama-server argv -> {flag: value}; every flag must be one the spec lists."""
    out: dict[str, str | bool] = {}
    it = iter(argv)
    for flag in it:
        flag = LLAMA_FLAG_ALIASES.get(flag, flag)
        assert flag in LLAMA_SERVER_FLAGS, f"unexpected llama-server flag {flag}"
        out[flag] = next(it) if LLAMA_SERVER_FLAGS[flag] else True
    return out


# ------------------------------------------------------------------------------------------
# Sizing arithmetic (docs/deploy.md section 6 and the chart's per-variant table): computed from
# jina-embeddings-v4's parameter counts, not measured.

LLM_PARAMS = 3.09e9
TIED_EMBEDDING = 0.311e9
VISION_PARAMS = 0.67e9
BYTES_PER_PARAM = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "Q8_0": 1.0625,
    "Q4_K_M": 0.60,
    "IQ4_XS": 0.53,
}
Q6_K = 210 / 256  # llama-quantize keeps a tied embedding at the output type
KV_PER_TOKEN = 36 * 2 * 2 * 128 * 2  # layers, K+V, KV heads, head dim, f16


def weight_bytes(variant: str) -> tuple[float, float, float]:
    """(text GGUF, mmproj, host copy of the tied embedding under GPU offload) in bytes."""
    b = BYTES_PER_PARAM[variant]
    embed = Q6_K if variant in ("Q4_K_M", "IQ4_XS") else b
    text = (LLM_PARAMS - TIED_EMBEDDING) * b + TIED_EMBEDDING * embed
    mmproj = VISION_PARAMS * (4.0 if variant == "f32" else 2.0)
    return text, mmproj, TIED_EMBEDDING * embed


# ------------------------------------------------------------------------------------------
# The Helm chart, rendered offline by Helm's own Go engine (the helm-python-sdk bindings)

CHART_DIR = ROOT / "deploy" / "helm" / "vlembed"
CHART_VALUES_FILES = ("values.yaml", "values-cpu.yaml", "values-gpu.yaml")


def merge_values(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep merge as Helm merges ``-f a.yaml -f b.yaml``: maps merge, everything else replaces
    (a null stays null, which Helm then reads as "delete this default")."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


def chart_values(*files: str, **overrides: Any) -> dict[str, Any]:
    """User values: the named files of the chart (not values.yaml, which Helm applies itself)
    merged in order, then ``overrides``."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra")
    values: dict[str, Any] = {}
    for name in files:
        if name != "values.yaml":
            values = merge_values(values, yaml.safe_load((CHART_DIR / name).read_text()) or {})
    return merge_values(values, overrides)


def render_chart(
    values: dict[str, Any], release: str = "vlembed", namespace: str = "emb"
) -> list[dict[str, Any]]:
    """Every resource ``helm template`` would print for these user values."""
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the dev extra")
    yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra")

    with helm.Chart.load(str(CHART_DIR)) as chart:
        rendered = chart.render(values, name=release, namespace=namespace)
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


# A converted model's manifest as the llama-server entrypoint reads it (jina-v4's pixel limit).
MANIFEST_MAX_PIXELS = 602112
MANIFEST_IMAGE_MAX_TOKENS = MANIFEST_MAX_PIXELS // 784  # what serve passes as --image-max-tokens


def write_manifest(model_dir: Path) -> None:
    """The part of manifest.json the containers read."""
    body = f'{{\n  "min_pixels": 3136,\n  "max_pixels": {MANIFEST_MAX_PIXELS}\n}}\n'
    (model_dir / "manifest.json").write_text(body)
