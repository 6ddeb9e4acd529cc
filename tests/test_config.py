"""Configuration: precedence, one-line errors, masking, generated docs in sync."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kame.config import ConfigError, KameConfig, dump_yaml
from kame.config_docs import render_markdown
from kame.server.config import AppConfig, load_app_config
from tests.support.environment import K8S_SERVICE_LINKS

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    f = write(tmp_path, "server:\n  port: 1111\n  host: 0.0.0.0\nfrontend:\n  batch_size: 3\n")
    assert load_app_config(environ={}).server.port == 8998
    assert load_app_config(f, environ={}).server.port == 1111
    env = {"KAME_SERVER__PORT": "2222"}
    cfg = load_app_config(f, environ=env)
    assert cfg.server.port == 2222
    assert cfg.server.host == "0.0.0.0"  # file value kept beside the env override
    assert cfg.frontend.batch_size == 3
    cfg = load_app_config(f, environ=env, overrides={"server.port": 3333, "server.host": None})
    assert cfg.server.port == 3333
    assert cfg.server.host == "0.0.0.0"  # a flag left unset (None) does not override


def test_env_values_are_typed_and_aliases(tmp_path: Path) -> None:
    env = {
        "KAME_FRONTEND__SAMPLING__TEMP": "0.5",
        "KAME_CACHE_DIR": str(tmp_path),
        "KAME_AUTH_TOKEN": "s3cret-token",
        "KAME_LLM_BASE_URL": "http://127.0.0.1:1/v1",  # read by the back-ends, not a setting
    }
    cfg = load_app_config(environ=env)
    assert cfg.frontend.sampling.temp == 0.5
    assert cfg.cache_dir == tmp_path
    assert cfg.server.auth_token is not None and cfg.server.auth_token.get_secret_value() == "s3cret-token"


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        ("server:\n  prot: 1\n", {}, "server.prot: unknown key"),
        ("frontend:\n  batch_size: lots\n", {}, "frontend.batch_size"),
        ("bogus: 1\n", {}, "bogus: unknown key"),
        ("", {"KAME_SERVER__PORT": "x"}, "environment: server.port"),
        ("", {"KAME_NOPE__X": "1"}, "environment variable KAME_NOPE__X: no such setting 'nope.x'"),
        ("", {"KAME_SERVER__PROT": "1"}, "environment variable KAME_SERVER__PROT: no such setting 'server.prot'"),
        ("", {"KAME_FRONTEND__SAMPLING__TEMPP": "1"}, "KAME_FRONTEND__SAMPLING__TEMPP: no such setting"),
        ("", {"KAME_DEVICE__X": "1"}, "KAME_DEVICE__X: no such setting 'device.x'"),
        ("a: [\n", {}, "invalid YAML"),
    ],
)
def test_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, env: dict[str, str], needle: str) -> None:
    f = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_app_config(f, environ=env)
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_app_config(tmp_path / "nope.yaml", environ={})


def test_show_masks_secrets() -> None:
    cfg = load_app_config(environ={"KAME_AUTH_TOKEN": "hunter2-very-secret"})
    text = dump_yaml(cfg)
    assert "hunter2-very-secret" not in text
    assert "auth_token: '***'" in text


def test_docs_in_sync_with_models() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == render_markdown(AppConfig), "docs/configuration.md is stale: run `kame config docs > docs/configuration.md`"


def test_cli_config_show_and_error(tmp_path: Path) -> None:
    kame = [sys.executable, "-m", "kame.cli"]
    ok = subprocess.run([*kame, "config", "show"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0, ok.stderr
    assert "port: 8998" in ok.stdout
    bad = write(tmp_path, "server:\n  port: -5\n")
    res = subprocess.run([*kame, "config", "show", "--config", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "server.port" in res.stderr
    assert "Traceback" not in res.stderr




def test_names_without_double_underscore_that_are_no_setting_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    from kame.config import ignored_env_names

    env = {**K8S_SERVICE_LINKS, "KAME_SERVER__PORT": "9001", "KAME_DEVICE": "cpu", "KAME_AUTH_TOKEN": "tok-123"}
    assert ignored_env_names(env, AppConfig) == sorted(K8S_SERVICE_LINKS)
    with caplog.at_level("WARNING", logger="kame.config"):
        cfg = load_app_config(environ=env)
        load_app_config(environ=env)  # a second load does not repeat the warnings
    assert cfg.server.port == 9001 and cfg.device == "cpu"
    warned = [r.getMessage() for r in caplog.records if r.name == "kame.config"]
    assert len(warned) == len(K8S_SERVICE_LINKS)
    for name in K8S_SERVICE_LINKS:
        (line,) = [w for w in warned if w.startswith(f"environment variable {name} ")]
        assert "ignored" in line and "\n" not in line
    assert not any("10.0.0.1" in w for w in warned)  # values are never logged


def test_the_projects_own_environment_variables_are_no_warning() -> None:
    """Every KAME_ name the project's scripts, tests and compose files read is a setting, an alias or a
    listed non-setting: ``KAME_VENVS=... ./scripts/test.sh`` once made every kame command print a warning
    line (and the one-line-error CLI tests fail)."""
    from kame.config import ignored_env_names

    shell = re.compile(r"\$\{?(KAME_[A-Z0-9_]+)")
    python = re.compile(r"(?:environ\.get\(|getenv\(|_ENV\s*=\s*)\s*\"(KAME_[A-Z0-9_]+)\"")
    files = [
        *ROOT.glob("scripts/*.sh"), *ROOT.glob(".ci/*"), *ROOT.glob("*.yml"), *ROOT.glob("deploy/**/*.yml"),
        *ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*.py"),
    ]
    read: set[str] = set()
    for f in files:
        text = f.read_text()
        read |= set((shell if f.suffix != ".py" else python).findall(text))
    assert {"KAME_VENVS", "KAME_IMAGE_CACHE", "KAME_UPDATE_GOLDEN", "KAME_PORT_HOST", "KAME_TORCH_SPEC"} <= read
    assert ignored_env_names(dict.fromkeys(read, "x"), AppConfig) == []


def test_cli_is_quiet_under_the_test_commands_variables(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "KAME_VENVS": str(tmp_path), "KAME_UPDATE_GOLDEN": "0", "KAME_IMAGE_DOCKER": "docker"}
    bad = write(tmp_path, "server:\n  port: -5\n")
    res = subprocess.run([sys.executable, "-m", "kame.cli", "config", "show", "--config", str(bad)],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr


def test_setting_paths_are_checked_below_the_top_level() -> None:
    from kame.config import setting_exists

    assert setting_exists("server.port", AppConfig) and setting_exists("frontend.sampling.temp")
    assert setting_exists("backends.mine.base_url")  # below a mapping: validated by pydantic
    assert not setting_exists("server.port.x", AppConfig) and not setting_exists("server.prot", AppConfig)
    assert not setting_exists("port") and not setting_exists("server.port")  # the core has no server section


def test_max_sessions_is_a_deprecated_name_for_batch_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One setting for the number of sessions: ``frontend.batch_size``; the old ``server.max_sessions`` moves
    there with a warning, keeping precedence, and a layer that sets both differently is an error."""
    f = write(tmp_path, "frontend:\n  batch_size: 8\n")
    with caplog.at_level("WARNING", logger="kame.config"):
        cfg = load_app_config(f, environ={"KAME_SERVER__MAX_SESSIONS": "2"})
    assert cfg.frontend.batch_size == 2 and cfg.server.max_sessions is None  # the environment wins over the file
    assert "server.max_sessions is deprecated" in caplog.text and "environment" in caplog.text
    assert load_app_config(f, environ={}, overrides={"frontend.batch_size": 6}).frontend.batch_size == 6  # kame serve --max-sessions
    assert load_app_config(write(tmp_path, "server:\n  max_sessions: 5\n"), environ={}).frontend.batch_size == 5
    with pytest.raises(ConfigError, match=r"server.max_sessions \(2\) and frontend.batch_size \(4\) disagree"):
        load_app_config(write(tmp_path, "server:\n  max_sessions: 2\nfrontend:\n  batch_size: 4\n"), environ={})


def test_the_core_config_does_not_import_the_server() -> None:
    """The server's config composes the core's (AppConfig extends KameConfig), never the other way round."""
    code = "import sys, kame.config; print(sorted(m for m in sys.modules if m.startswith('kame.server')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    assert issubclass(AppConfig, KameConfig)
    assert set(AppConfig.model_fields) - set(KameConfig.model_fields) == {"server", "log", "twilio", "sip"}


def test_switch_interval_ms_sets_pythons_gil_switch_interval_and_0_keeps_it() -> None:
    from kame.commands.serve import apply_switch_interval

    before = sys.getswitchinterval()
    try:
        assert not apply_switch_interval(AppConfig().server.switch_interval_ms)
        assert sys.getswitchinterval() == before
        assert apply_switch_interval(0.5)
        assert abs(sys.getswitchinterval() - 0.0005) < 1e-9
    finally:
        sys.setswitchinterval(before)
