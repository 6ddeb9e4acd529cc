"""What can be checked of the Docker deployment without a Docker engine."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kame.config import ENV_NOT_SETTINGS, env_overrides
from kame.server.config import AppConfig, load_app_config

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_compose_env_is_what_the_server_reads() -> None:
    env = {k: str(v) for k, v in compose()["services"]["kame"]["environment"].items()}
    kame_vars = {k: v for k, v in env.items() if k.startswith("KAME_")}
    settings = {k: v for k, v in kame_vars.items() if k not in ENV_NOT_SETTINGS}
    assert settings, "expected some KAME_ settings"
    env_overrides(settings, model=AppConfig)  # raises on a name that is no setting
    cfg = load_app_config(environ=kame_vars)
    assert cfg.frontend.batch_size == int(env["KAME_FRONTEND__BATCH_SIZE"])
    from kame.backend.resolve import resolve_backends

    resolved = resolve_backends(cfg, kame_vars)
    assert resolved.default is not None
    backend = resolved.backends[resolved.default]
    assert backend.base_url == env["KAME_LLM_BASE_URL"]
    assert backend.model == env["KAME_LLM_MODEL"]


def test_compose_vllm_serves_the_model_kame_asks_for() -> None:
    services = compose()["services"]
    env = services["kame"]["environment"]
    url = env["KAME_LLM_BASE_URL"]
    host, port = re.match(r"http://([^:/]+):(\d+)/v1$", url).groups()  # type: ignore[union-attr]
    assert host in services and port == "8000"  # vLLM's default port
    command = services["vllm"]["command"]
    assert command[command.index("--model") + 1] == env["KAME_LLM_MODEL"]
    for name in ("kame", "vllm"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


def test_ports_and_health_match_the_server() -> None:
    port = AppConfig().server.port
    df = dockerfile()
    assert f"EXPOSE {port}" in df
    assert f"KAME_SERVER__PORT={port}" in df and "KAME_SERVER__HOST=0.0.0.0" in df
    assert f"{port}:{port}" in compose()["services"]["kame"]["ports"]
    m = re.search(r"HEALTHCHECK .*--start-period=(\d+)s.*\n\s*CMD .*http://127.0.0.1:%s(/\w+).*KAME_SERVER__PORT', '(\d+)'", df)
    assert m is not None
    assert int(m.group(1)) >= 300 and int(m.group(3)) == port and m.group(2) == "/health"
    from kame.server.app.factory import create_app

    paths: set[str] = set()
    for route in create_app(AppConfig(), device="cpu", environ={}).routes:
        inner = getattr(route, "original_router", None)  # FastAPI's included routers
        paths |= {r.path for r in inner.routes} if inner is not None else {getattr(route, "path", "")}
    assert {"/health", "/ready", "/metrics", "/api/chat"} <= paths


def test_dockerfile_installs_like_the_readme() -> None:
    df = dockerfile()
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^    ./scripts/install.sh --deps-only$", df, re.M) and re.search(r"^    ./scripts/install.sh$", df, re.M)
    assert "./scripts/serve.sh" in readme and (ROOT / "scripts" / "serve.sh").read_text().count("./scripts/install.sh") == 1
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:[\w.\-]+runtime", df, re.M) and "FROM ${BASE_IMAGE}" in df
    user = re.findall(r"^USER (\w+)", df, re.M)
    assert user and user[-1] != "root"
    volume = re.search(r'VOLUME \["(/\w+)"\]', df)
    assert volume is not None
    for var in ("HF_HOME", "KAME_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert re.search(rf"{var}={volume.group(1)}/", df), f"{var} is not on the volume"
    # torch.compile needs a compiler and the Python headers at run time; a runtime base has neither
    assert 'pkgs="$pkgs gcc g++"' in df and 'pkgs="$pkgs python3-dev"' in df
    from kame.server.app.serving import shutdown_budget_s

    server = AppConfig().server
    budget = shutdown_budget_s(server.drain_grace_s, server.drain_timeout_s)
    assert budget < 10  # Docker's default grace period (docker stop -t 10)
    grace = compose()["services"]["kame"]["stop_grace_period"]
    assert int(grace.rstrip("s")) > budget
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and ".git/" in ignored
