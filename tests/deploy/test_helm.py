"""deploy/helm/vlembed: rendered by Helm's own engine, every resource validated against the
Kubernetes schemas, and kept in step with the images, entrypoints, settings and sizing.

No cluster is needed. The chart is rendered offline with helm-python-sdk (Helm's Go SDK behind a
C ABI, the same template engine as ``helm template``) and each resource is validated with
kubernetes-validate (the Kubernetes OpenAPI schemas per release, strict: unknown fields fail).
The llama-server containers' variables are run through the real docker/ entrypoint, so the
command line the chart starts is the one ``vlembed serve`` starts.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_helpers import (
    API_PORT,
    CHART_DIR,
    CHART_VALUES_FILES,
    KV_PER_TOKEN,
    LLAMA_ENTRYPOINT_ENV,
    LLAMA_PORT,
    MANIFEST_IMAGE_MAX_TOKENS,
    ROOT,
    SERVE_ENTRYPOINT_ENV,
    SERVE_ENV,
    TASKS,
    VARIANTS,
    chart_values,
    environment,
    llama_server_flags,
    load_compose,
    render_chart,
    run_docker_script,
    stub_program,
    weight_bytes,
    write_manifest,
)

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the dev extra")

# The oldest release the chart claims (Chart.yaml kubeVersion) and the newest with schemas.
K8S_VERSIONS = ("1.25.0", kv.latest_version())
SCALE_DOC = ROOT / "docs" / "scale.md"

# Values the chart must render valid resources for: the two shipped files, the defaults, and
# every optional resource switched on.
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": chart_values(),
    "cpu": chart_values("values-cpu.yaml"),
    "gpu": chart_values("values-gpu.yaml"),
    "everything": chart_values(
        "values-gpu.yaml",
        model={"tasks": list(TASKS), "variant": "Q8_0", "subPath": "jina-v4"},
        apiKey={"create": True, "value": "s3cret"},
        convert={"enabled": True, "hfClaim": "hf-checkpoints", "quant": "Q8_0,Q4_K_M"},
        llamaServer={"extraArgs": ["--no-mmproj-offload"], "flashAttn": "on", "repack": "off"},
        api={"maxQueue": 64, "requestTimeout": 300},
        images={"pullSecrets": [{"name": "registry"}]},
        podAnnotations={"prometheus.io/scrape": "true"},
    ),
    "host-path, existing secret": chart_values(
        "values-cpu.yaml",
        model={"hostPath": "/srv/vlembed/models", "persistence": {"enabled": False}},
        apiKey={"existingSecret": "vlembed-key", "secretKey": "key"},
        autoscaling={"enabled": False},
        podDisruptionBudget={"enabled": False},
    ),
}
SHIPPED = {"cpu": "values-cpu.yaml", "gpu": "values-gpu.yaml"}


@pytest.fixture(scope="module", params=list(SCENARIOS))
def scenario(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render_chart(SCENARIOS[request.param])


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} resources"
    return found[0]


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _llama_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for name, c in _containers(docs).items() if name.startswith("llama-server-")]


def _validate(doc: dict[str, Any], version: str) -> None:
    kv.validate(doc, version, strict=True)


# ------------------------------------------------------------------------------- validation


def test_chart_lints_without_warnings() -> None:
    for files in ((), ("values-cpu.yaml",), ("values-gpu.yaml",)):
        report = helm.lint(str(CHART_DIR), chart_values(*files), strict=True)
        assert not report["errors"], report
        serious = [m for m in report["messages"] if m["severity"] >= 2]
        assert not serious, serious


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_resource_validates(
    scenario: tuple[str, list[dict[str, Any]]], version: str
) -> None:
    name, docs = scenario
    kinds = sorted(d["kind"] for d in docs)
    assert {"Deployment", "Service"} <= set(kinds), kinds
    for doc in docs:
        try:
            _validate(doc, version)
        except kv.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']} @ {version}: {exc}")


def test_the_validator_rejects_broken_manifests() -> None:
    """The validation is live: a misspelt field, a wrong type and a bad enum each fail."""
    docs = render_chart(SCENARIOS["cpu"])
    deployment, hpa = _one(docs, "Deployment"), _one(docs, "HorizontalPodAutoscaler")
    for doc in (deployment, hpa):
        _validate(doc, K8S_VERSIONS[-1])  # intact: passes

    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = [8080]
    bad_metric = copy.deepcopy(hpa)
    bad_metric["spec"]["metrics"][0]["type"] = 7
    no_target = copy.deepcopy(hpa)
    del no_target["spec"]["scaleTargetRef"]
    for broken in (misspelt, wrong_type, bad_metric, no_target):
        with pytest.raises(kv.ValidationError):
            _validate(broken, K8S_VERSIONS[-1])


def test_chart_kube_version_is_the_oldest_validated() -> None:
    yaml = pytest.importorskip("yaml")
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={K8S_VERSIONS[0]}-0"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model": {"persistence": {"enabled": False}}}, "exactly one of"),
        ({"model": {"existingClaim": "models"}}, "exactly one of"),
        ({"apiKey": {"create": True}}, "needs apiKey.value"),
        ({"apiKey": {"create": True, "value": "k", "existingSecret": "s"}}, "not both"),
        ({"model": {"variant": "Q5_K_S"}}, "no entry for model.variant"),
        ({"convert": {"enabled": True}}, "needs convert.hfClaim"),
    ],
)
def test_chart_refuses_inconsistent_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render_chart(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model": {"varian": "f16"}}, "additional properties 'varian' not allowed"),
        ({"llamaServer": {"thread": 4}}, "additional properties 'thread' not allowed"),
        ({"parallel": 0}, "/parallel"),
        ({"model": {"tasks": ["retrival"]}}, "/model/tasks/0"),
        ({"llamaServer": {"flashAttn": "yes"}}, "/llamaServer/flashAttn"),
    ],
)
def test_values_schema_refuses_typos_and_bad_values(values: dict[str, Any], message: str) -> None:
    """values.schema.json: Helm checks it before rendering, so a misspelt key is an error."""
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render_chart(values)


def test_values_schema_enums_are_the_contract() -> None:
    import json

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    props = schema["properties"]
    assert props["model"]["properties"]["tasks"]["items"]["enum"] == list(TASKS)
    yaml = pytest.importorskip("yaml")
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(defaults["llamaServer"]["sizing"]) == set(VARIANTS)
    import typing

    from preprocess_service.settings import AutoOnOff

    for key in ("flashAttn", "repack"):
        allowed = props["llamaServer"]["properties"][key]["enum"]
        assert set(allowed) - {None} == set(typing.get_args(AutoOnOff)), key
    assert set(defaults) <= set(props), set(defaults) - set(props)


# -------------------------------------------------------------- in step with docker/ + serve


def _env(container: dict[str, Any]) -> dict[str, str]:
    assert all("value" in e for e in container["env"]), "only literal variables are expected"
    return environment({"environment": {e["name"]: e["value"] for e in container["env"]}})


def _fake_model(tmp_path: Path, tasks: list[str], variant: str, mmproj: str) -> Path:
    d = tmp_path / "models"
    d.mkdir(exist_ok=True)
    write_manifest(d)
    (d / f"mmproj-{mmproj}.gguf").write_text("{}")
    for task in tasks:
        (d / f"text-{task}-{variant}.gguf").write_text("{}")
    return d


@pytest.mark.parametrize("name", ["cpu", "gpu", "everything"])
def test_llama_server_command_line_is_the_one_serve_uses(name: str, tmp_path: Path) -> None:
    """Each llama-server container's variables, through docker/llama-server-entrypoint.sh, give
    the command line `vlembed serve` builds for the same settings (ServerSpec)."""
    from preprocess_service.serve import resolve_flash_attn, resolve_repack
    from preprocess_service.supervisor import ServerSpec

    docs = render_chart(SCENARIOS[name])
    containers = _llama_containers(docs)
    values = SCENARIOS[name]
    tasks = [_env(c)["VLEMBED_TASK"] for c in containers]
    assert tasks == values.get("model", {}).get("tasks", ["retrieval"])
    for i, container in enumerate(containers):
        env = _env(container)
        assert set(env) <= LLAMA_ENTRYPOINT_ENV, set(env) - LLAMA_ENTRYPOINT_ENV
        variant, mmproj = env["VLEMBED_VARIANT"], env["VLEMBED_MMPROJ_DTYPE"]
        model_dir = _fake_model(tmp_path, tasks, variant, mmproj)
        stub_program(tmp_path / "bin", "llama-server")
        proc, rec = run_docker_script(
            "llama-server-entrypoint.sh",
            tmp_path,
            {**env, "VLEMBED_MODEL": str(model_dir)},
            *container.get("args", []),
        )
        assert proc.returncode == 0, proc.stderr
        extra = container.get("args", [])
        argv = rec["argv"][: len(rec["argv"]) - len(extra)]
        assert rec["argv"][len(argv) :] == extra
        threads = int(env["VLEMBED_THREADS"]) if "VLEMBED_THREADS" in env else None
        spec = ServerSpec(
            binary=Path("llama-server"),
            model=model_dir / f"text-{tasks[i]}-{variant}.gguf",
            mmproj=model_dir / f"mmproj-{mmproj}.gguf",
            port=LLAMA_PORT + i,
            host="0.0.0.0",
            parallel=int(env["VLEMBED_PARALLEL"]),
            threads=threads,
            ctx_per_slot=int(env["VLEMBED_CTX_SIZE"]),
            flash_attn=resolve_flash_attn(variant, env.get("VLEMBED_FLASH_ATTN", "auto")),
            repack=resolve_repack(variant, env.get("VLEMBED_REPACK", "auto")),
            image_max_tokens=MANIFEST_IMAGE_MAX_TOKENS,
        )
        assert llama_server_flags(argv) == llama_server_flags(spec.argv()[1:])
        port = int(llama_server_flags(argv)["--port"])
        assert [p["containerPort"] for p in container["ports"]] == [port]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": port}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_api_is_pointed_at_its_llama_servers(name: str) -> None:
    docs = render_chart(SCENARIOS[name])
    api = _containers(docs)["api"]
    env = _env(api)
    assert set(env) <= SERVE_ENV | SERVE_ENTRYPOINT_ENV, set(env) - SERVE_ENV - SERVE_ENTRYPOINT_ENV
    llamas = [_env(c) for c in _llama_containers(docs)]
    expected = [f"{e['VLEMBED_TASK']}=http://127.0.0.1:{e['VLEMBED_LLAMA_PORT']}" for e in llamas]
    assert env["VLEMBED_BACKENDS"].split(",") == expected
    assert env["VLEMBED_TASKS"].split(",") == [e["VLEMBED_TASK"] for e in llamas]
    for shared in ("VLEMBED_MODEL", "VLEMBED_VARIANT", "VLEMBED_PARALLEL", "VLEMBED_CTX_SIZE"):
        assert {env[shared]} == {e[shared] for e in llamas}, shared
    assert env["VLEMBED_PORT"] == str(API_PORT)
    assert api["ports"] == [{"name": "http", "containerPort": API_PORT}]
    service = _one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert (
        service["spec"]["selector"] == _one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert api["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    from preprocess_service.settings import ServeSettings

    settings = ServeSettings(
        **{
            k.removeprefix("VLEMBED_").lower(): v
            for k, v in env.items()
            if k in SERVE_ENV and k != "VLEMBED_BACKENDS"
        }
    )
    assert settings.port == API_PORT


@pytest.mark.parametrize("name", ["everything", "host-path, existing secret"])
def test_api_key_secret_reaches_serve(name: str, tmp_path: Path) -> None:
    """The mounted Secret file is where VLEMBED_API_KEY_FILE points, and the image's entrypoint
    turns it into serve's VLEMBED_API_KEY."""
    docs = render_chart(SCENARIOS[name])
    api = _containers(docs)["api"]
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    key_file = _env(api)["VLEMBED_API_KEY_FILE"]
    (mount,) = [m for m in api["volumeMounts"] if m["name"] == "api-key"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-key"]
    (item,) = volume["secret"]["items"]
    assert key_file == f"{mount['mountPath']}/{item['path']}"
    secrets = [d for d in docs if d["kind"] == "Secret"]
    if secrets:
        assert secrets[0]["metadata"]["name"] == volume["secret"]["secretName"]
        assert secrets[0]["stringData"] == {item["key"]: "s3cret"}
    else:
        assert volume["secret"]["secretName"] == "vlembed-key" and item["key"] == "key"
    assert pod["securityContext"]["fsGroup"] == 10001  # the images' group can read the key
    # the entrypoint, with the file where the chart mounts it
    local = tmp_path / "secret"
    local.write_text("s3cret\n")
    stub_program(tmp_path / "bin", "vlembed")
    env = {**_env(api), "VLEMBED_API_KEY_FILE": str(local)}
    proc, rec = run_docker_script("serve-entrypoint.sh", tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert rec["env"]["VLEMBED_API_KEY"] == "s3cret"
    assert rec["env"]["VLEMBED_BACKENDS"] == _env(api)["VLEMBED_BACKENDS"]


def test_no_key_means_no_secret_mount() -> None:
    docs = render_chart(SCENARIOS["cpu"])
    api = _containers(docs)["api"]
    assert "VLEMBED_API_KEY_FILE" not in _env(api)
    assert not [d for d in docs if d["kind"] == "Secret"]


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_images_are_the_ones_compose_builds(name: str) -> None:
    compose = load_compose()["services"]
    containers = _containers(render_chart(SCENARIOS[name]))
    assert containers["api"]["image"] == compose["api"]["image"]
    llama_service = "llama-server-gpu" if name == "gpu" else "llama-server"
    for c in _llama_containers(render_chart(SCENARIOS[name])):
        assert c["image"] == compose[llama_service]["image"]


def test_model_volume_is_mounted_read_only_where_the_entrypoints_look() -> None:
    for name, values in SCENARIOS.items():
        docs = render_chart(values)
        pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
        for c in pod["containers"]:
            assert _env(c)["VLEMBED_MODEL"] == "/models"
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "models"]
            assert mount["mountPath"] == "/models" and mount["readOnly"], name
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            pvcs = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
            assert claim in pvcs or claim == values.get("model", {}).get("existingClaim"), name
        else:
            assert volume["hostPath"]["path"] == values["model"]["hostPath"]


def test_convert_job_is_the_compose_convert_service() -> None:
    docs = render_chart(SCENARIOS["everything"])
    job = _one(docs, "Job")["spec"]["template"]["spec"]
    (c,) = job["containers"]
    compose = load_compose({"VLEMBED_CONVERT_QUANT": "Q8_0,Q4_K_M"})["services"]["convert"]
    assert c["image"] == compose["image"]
    assert c["args"] == compose["command"]
    (models,) = [m for m in c["volumeMounts"] if m["name"] == "models"]
    assert not models.get("readOnly") and models["mountPath"] == "/models"


# ------------------------------------------------------------------------------- resources


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi"))


def _expected_mib(variant: str, gpu: bool, ctx: int, parallel: int, headroom_gb: float) -> int:
    text, mmproj, host = weight_bytes(variant)
    model = math.ceil(host / 2**20) if gpu else math.ceil((text + mmproj) / 2**20)
    kv_cache = 0 if gpu else math.ceil(KV_PER_TOKEN * ctx * parallel / 2**20)
    total = model + kv_cache + math.ceil(headroom_gb * 1e9 / 2**20)
    return math.ceil(total / 256) * 256


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_memory_is_the_sizing_arithmetic(variant: str, gpu: bool) -> None:
    """Request = limit = weights in this container's RAM (+ KV cache on CPU) + headroom:
    docs/deploy.md section 6's arithmetic, for the variant, ctxSize and parallel rendered."""
    files = ("values-gpu.yaml",) if gpu else ("values-cpu.yaml",)
    for ctx, parallel in ((4096, 2), (8192, 3)):
        values = chart_values(*files, model={"variant": variant}, ctxSize=ctx, parallel=parallel)
        (llama,) = _llama_containers(render_chart(values))
        res = llama["resources"]
        expected = _expected_mib(variant, gpu, ctx, parallel, 3.0 if gpu else 2.0)
        assert _mib(res["requests"]["memory"]) == _mib(res["limits"]["memory"]) == expected


def test_cpu_pods_get_whole_cores_for_their_threads() -> None:
    (llama,) = _llama_containers(render_chart(SCENARIOS["cpu"]))
    threads = _env(llama)["VLEMBED_THREADS"]
    assert llama["resources"]["requests"]["cpu"] == llama["resources"]["limits"]["cpu"] == threads
    assert "nvidia.com/gpu" not in llama["resources"]["limits"]


def test_gpu_pods_ask_for_a_gpu_and_run_where_one_is() -> None:
    docs = render_chart(SCENARIOS["gpu"])
    (llama,) = _llama_containers(docs)
    assert llama["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "VLEMBED_THREADS" not in _env(llama)
    assert llama["image"].endswith("-cuda")
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


# ------------------------------------------------------------------------------ autoscaling


def _gauges() -> set[str]:
    from preprocess_service.metrics import Metrics

    return {m.name for m in Metrics().registry.collect() if m.type == "gauge"}


@pytest.mark.parametrize("name", list(SHIPPED))
def test_hpa_scales_the_deployment_on_the_services_queue_gauge(name: str) -> None:
    docs = render_chart(SCENARIOS[name])
    hpa, deployment = _one(docs, "HorizontalPodAutoscaler"), _one(docs, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "vlembed_queue_depth"
    assert "vlembed_queue_depth" in _gauges()
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


def test_without_autoscaling_the_deployment_has_its_replicas() -> None:
    docs = render_chart(chart_values(replicaCount=3))
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert _one(docs, "Deployment")["spec"]["replicas"] == 3


# ---------------------------------------------------------------------------------- docs


def _doc_helm_commands() -> list[list[str]]:
    import shlex

    text = SCALE_DOC.read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["helm"]:
                out.append(words)
    return out


def test_scale_doc_helm_commands_name_real_files_and_values() -> None:
    commands = _doc_helm_commands()
    assert commands, "docs/scale.md shows no helm command"
    yaml = pytest.importorskip("yaml")
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for words in commands:
        for i, w in enumerate(words):
            if w in ("-f", "--values"):
                assert (ROOT / words[i + 1]).is_file(), words[i + 1]
                assert Path(words[i + 1]).name in CHART_VALUES_FILES
            if w == "--set" or w == "--set-string":
                key = words[i + 1].split("=", 1)[0]
                node: Any = defaults
                for part in key.split("."):
                    assert isinstance(node, dict) and part in node, key
                    node = node[part]
            if w in ("install", "upgrade", "template"):
                assert any((ROOT / a).resolve() == CHART_DIR for a in words if "/" in a)
