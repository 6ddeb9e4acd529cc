"""Configuration: precedence, one-line errors, masking, generated docs in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kame.config import ConfigError, dump_yaml, load_config
from kame.config_docs import render_markdown

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    f = write(tmp_path, "server:\n  port: 1111\n  host: 0.0.0.0\nfrontend:\n  batch_size: 3\n")
    assert load_config(environ={}).server.port == 8998
    assert load_config(f, environ={}).server.port == 1111
    env = {"KAME_SERVER__PORT": "2222"}
    cfg = load_config(f, environ=env)
    assert cfg.server.port == 2222
    assert cfg.server.host == "0.0.0.0"  # file value kept beside the env override
    assert cfg.frontend.batch_size == 3
    cfg = load_config(f, environ=env, overrides={"server.port": 3333, "server.host": None})
    assert cfg.server.port == 3333
    assert cfg.server.host == "0.0.0.0"  # a flag left unset (None) does not override


def test_env_values_are_typed_and_aliases(tmp_path: Path) -> None:
    env = {
        "KAME_FRONTEND__SAMPLING__TEMP": "0.5",
        "KAME_CACHE_DIR": str(tmp_path),
        "KAME_AUTH_TOKEN": "s3cret-token",
        "KAME_LLM_BASE_URL": "http://127.0.0.1:1/v1",  # read by the back-ends, not a setting
    }
    cfg = load_config(environ=env)
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
        ("", {"KAME_NOPE": "1"}, "KAME_NOPE"),
        ("a: [\n", {}, "invalid YAML"),
    ],
)
def test_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, env: dict[str, str], needle: str) -> None:
    f = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(f, environ=env)
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_show_masks_secrets() -> None:
    cfg = load_config(environ={"KAME_AUTH_TOKEN": "hunter2-very-secret"})
    text = dump_yaml(cfg)
    assert "hunter2-very-secret" not in text
    assert "auth_token: '***'" in text


def test_docs_in_sync_with_models() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == render_markdown(), "docs/configuration.md is stale: run `kame config docs > docs/configuration.md`"


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
