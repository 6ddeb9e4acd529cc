"""The Kubernetes manifests (deploy/kubernetes): rendered with the real ``kubectl kustomize`` and
validated offline against the Kubernetes API schemas (``kubernetes-validate``, strict), then checked
against what the server actually reads, serves and exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kame.config import ENV_NOT_SETTINGS, env_overrides
from kame.server.config import AppConfig, load_app_config

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("base", "vllm")
K8S_VERSION = "1.33.0"  # schemas of a current release; the manifests use only long-stable APIs


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl missing: scripts/install.sh --test installs Debian's kubectl"
    out = subprocess.run([kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def docs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def of_kind(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = of_kind(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def kame_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment", "kame")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "kame")


def test_every_resource_validates_against_the_kubernetes_schemas(docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler", "PersistentVolumeClaim"} <= kinds
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on an unknown or misplaced field


def test_the_validator_catches_a_broken_manifest(docs: list[dict[str, Any]]) -> None:
    """The schema check is real: a misspelt field and a wrong type are both refused."""
    import copy

    dep = copy.deepcopy(one(docs, "Deployment", "kame"))
    dep["spec"]["template"]["spec"]["enableServiceLink"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
    dep = copy.deepcopy(one(docs, "Deployment", "kame"))
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_pods_have_a_gpu_and_no_service_links(docs: list[dict[str, Any]]) -> None:
    for dep in of_kind(docs, "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False, dep["metadata"]["name"]  # KAME_PORT=tcp://... / VLLM_PORT
        for c in pod["containers"]:
            assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
            assert str(c["resources"]["requests"]["nvidia.com/gpu"]) == "1"


def _app_paths() -> set[str]:
    from kame.server.app.factory import create_app

    paths: set[str] = set()
    for route in create_app(AppConfig(), device="cpu", environ={}).routes:
        inner = getattr(route, "original_router", None)
        paths |= {r.path for r in inner.routes} if inner is not None else {getattr(route, "path", "")}
    return paths


def test_probes_fit_a_first_download_and_readiness_ignores_fullness(docs: list[dict[str, Any]]) -> None:
    c = kame_container(docs)
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    paths = _app_paths()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["port"] in port_names and port_names[get["port"]] == 8998
        assert get["path"].split("?")[0] in paths
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready?full_ok=1"  # a full pod stays Ready
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60  # ~16 GB on a slow link
    dep = one(docs, "Deployment", "kame")
    assert dep["spec"]["progressDeadlineSeconds"] >= 20 * 60
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def _config(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    c = kame_container(docs)
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    dep = one(docs, "Deployment", "kame")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    cm_volume = next(n for n, v in volumes.items() if "configMap" in v)
    cm = one(docs, "ConfigMap", volumes[cm_volume]["configMap"]["name"])  # the generated, hashed name
    (key,) = cm["data"]
    assert env["KAME_CONFIG"] == f"{mounts[cm_volume]}/{key}"
    return yaml.safe_load(cm["data"][key]), env


def test_config_map_and_environment_are_what_kame_reads(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    data, env = _config(docs)
    path = tmp_path / "kame.yaml"
    path.write_text(yaml.safe_dump(data))
    kame_env = {k: v for k, v in env.items() if k.startswith("KAME_") and k != "KAME_CONFIG"}
    env_overrides({k: v for k, v in kame_env.items() if k not in ENV_NOT_SETTINGS}, model=AppConfig)  # unknown names raise
    cfg = load_app_config(path, environ=kame_env)
    assert cfg.server.host == "0.0.0.0" and cfg.server.port == 8998
    assert cfg.device.startswith("cuda")
    c = kame_container(docs)
    assert any(ref.get("secretRef", {}).get("name") == "kame-secrets" for ref in c.get("envFrom", []))
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    dep = one(docs, "Deployment", "kame")
    models = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
    one(docs, "PersistentVolumeClaim", models["persistentVolumeClaim"]["claimName"])
    for var in ("HF_HOME", "KAME_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert env[var].startswith(mounts["models"] + "/"), f"{var} is not on the model volume"


def test_grace_period_covers_the_drain(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    data, env = _config(docs)
    path = tmp_path / "kame.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_app_config(path, environ={k: v for k, v in env.items() if k.startswith("KAME_") and k != "KAME_CONFIG"})
    grace = one(docs, "Deployment", "kame")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    from kame.server.app.serving import shutdown_budget_s

    # a call that has just started when the rollout reaches its pod still gets its whole length
    assert cfg.server.drain_grace_s >= cfg.server.max_duration_s == 3600
    assert grace >= shutdown_budget_s(cfg.server.drain_grace_s, cfg.server.drain_timeout_s) + 5


def test_service_pdb_and_hpa_point_at_the_kame_pods(docs: list[dict[str, Any]]) -> None:
    dep = one(docs, "Deployment", "kame")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = one(docs, "Service", "kame")
    assert svc["spec"]["selector"].items() <= labels.items()
    c = kame_container(docs)
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in c["ports"]}
    pdb = one(docs, "PodDisruptionBudget", "kame")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one(docs, "HorizontalPodAutoscaler", "kame")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "kame"}
    assert hpa["spec"]["minReplicas"] >= 2  # one pod draining never leaves the service empty
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "kame_session_occupancy"
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"


def test_prometheus_adapter_rule_makes_the_hpa_metric_from_exported_gauges() -> None:
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["name"]["as"] == "kame_session_occupancy"
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    from kame.server.telemetry.metrics import ServerMetrics

    exported = set(re.findall(r"^# TYPE (\w+) ", ServerMetrics().render().decode(), re.M))
    used = set(re.findall(r"\b(kame_\w+)\{", rule["metricsQuery"] + rule["seriesQuery"]))
    assert used == {"kame_sessions_active", "kame_sessions_max"}
    assert used <= exported


def test_vllm_overlay_makes_vllm_the_default_backend() -> None:
    docs = render("vllm")
    env = {e["name"]: e.get("value") for e in kame_container(docs)["env"]}
    m = re.fullmatch(r"http://([a-z0-9-]+):(\d+)/v1", env["KAME_LLM_BASE_URL"])
    assert m is not None
    svc = one(docs, "Service", m.group(1))
    assert svc["spec"]["ports"][0]["port"] == int(m.group(2))
    vllm = one(docs, "Deployment", "vllm")
    assert svc["spec"]["selector"].items() <= vllm["spec"]["template"]["metadata"]["labels"].items()
    (c,) = vllm["spec"]["template"]["spec"]["containers"]
    assert c["args"][c["args"].index("--model") + 1] == env["KAME_LLM_MODEL"]
    assert c["args"][c["args"].index("--port") + 1] == str(svc["spec"]["ports"][0]["port"])
    from kame.backend.resolve import resolve_backends

    data, kenv = _config(docs)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "kame.yaml"
        p.write_text(yaml.safe_dump(data))
        kame_env = {k: v for k, v in kenv.items() if k.startswith("KAME_") and k != "KAME_CONFIG"}
        resolved = resolve_backends(load_app_config(p, environ=kame_env), kame_env)
    assert resolved.default is not None
    assert resolved.backends[resolved.default].base_url == env["KAME_LLM_BASE_URL"]
    base = render("base")
    assert "KAME_LLM_BASE_URL" not in {e["name"] for e in kame_container(base)["env"]}


def test_example_secret_holds_only_known_names() -> None:
    secret = yaml.safe_load((K8S / "base" / "secret.example.yaml").read_text())
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    names = set(secret["stringData"])
    kame = {n for n in names if n.startswith("KAME_")}
    env_overrides({n: "x" for n in kame if n not in ENV_NOT_SETTINGS}, model=AppConfig)
    assert "KAME_AUTH_TOKEN" in names and "KAME_LLM_API_KEY" in names
