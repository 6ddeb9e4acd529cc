"""The wheel holds every module of the tree under its kame.* name (packages found, not listed), and its data files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"kame": "kame", "server": "kame/server", "client": "kame/client", "configs": "kame/configs"}


def test_wheel_ships_every_package_under_its_kame_name(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: no build/ left over from earlier builds, none left in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for folder in MAPPED:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(src)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("kame-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{name}/{module.relative_to(ROOT / folder).as_posix()}"
        for folder, name in MAPPED.items() for module in (ROOT / folder).rglob("*.py")
    }
    assert expected and expected <= names, sorted(expected - names)
    assert "kame/commands/serve.py" in names  # the CLI's sub-commands (once missing from a hand-written list)
    assert not any(n.startswith(("server/", "client/", "configs/")) for n in names)  # nothing bare in site-packages
    assert {"kame/configs/default.yaml", "kame/server/static/app.js", "kame/data/tiny_corpus.txt"} <= names
