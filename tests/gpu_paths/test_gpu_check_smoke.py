"""``bench/gpu_check.sh --prepare`` then ``run.sh --smoke`` with only python, torch and numpy importable.

The lent GPU box has python, torch (with what torch itself requires) and numpy, and reaches no registry:
the prepared folder must carry everything else. Here a venv without pip and without system site
packages sees only links to those packages of this checkout's .venv; run.sh must then get through every
stage on CPU (tiny checkpoints written and loaded once, the engine ticks, the STT beside, a real
``kame serve`` with Realtime clients) and write gpu_check.json. A venv without torch or numpy, or a
Python other than the wheels', gets a gpu_check.json saying what is missing. Preparing downloads wheels
from PyPI (cached outside the checkout).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dist_closure(names: list[str]) -> set[str]:
    """``names`` and every distribution they require (no extras), recursively."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(key)
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def _top_levels(dist_name: str) -> set[str]:
    """The top-level modules and folders a distribution installed (from its RECORD)."""
    out: set[str] = set()
    for f in metadata.distribution(dist_name).files or []:
        top = f.parts[0]
        if top.endswith(".dist-info") or top == ".." or top == "__pycache__" or top.endswith(".pth"):
            continue
        out.add(top)
    return out


def make_bare_python(where: Path, *, numpy: bool = True) -> Path:
    """A venv whose only packages are torch (and its own requirements) and numpy, as on the GPU box."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(where)
    py = where / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip())
    pkgs = where / "pkgs"
    pkgs.mkdir()
    src = Path(metadata.distribution("torch").locate_file(""))
    for dist in _dist_closure(["torch", *(["numpy"] if numpy else [])]):
        for top in _top_levels(dist):
            if (src / top).exists() and not (pkgs / top).exists():
                (pkgs / top).symlink_to(src / top)
    (site / "bare_gpu_box.pth").write_text(str(pkgs) + "\n")
    return py


def test_prepared_folder_runs_the_smoke_check_with_only_torch_and_numpy(tmp_path: Path) -> None:
    py = make_bare_python(tmp_path / "bare")
    # the bare python really lacks what the check needs
    probe = subprocess.run([str(py), "-c", "import torch, numpy\nimport pydantic"], capture_output=True, text=True)
    assert "No module named 'pydantic'" in probe.stderr, probe.stderr
    prepared = tmp_path / "gpu_check"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--prepare", str(prepared), "--python-version", version],
                   check=True, timeout=600)
    size = sum(f.stat().st_size for f in prepared.rglob("*") if f.is_file())
    assert size <= 64 * 2**20, f"prepared folder is {size / 2**20:.1f} MiB"
    wheels = {w.name.split("-")[0].lower() for w in (prepared / "wheels").glob("*.whl")}
    assert not wheels & {"torch", "numpy", "aiortc", "av", "faster_whisper", "ctranslate2", "sphn", "soxr"}, wheels
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "KAME_"))}
    env.update(PYTHON=str(py), PATH=f"{py.parent}:/usr/bin:/bin", TMPDIR=str(tmp_path), GPU_CHECK_WORK=str(tmp_path / "work"),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(prepared / "run.sh"), "--smoke"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    result = json.loads((prepared / "gpu_check.json").read_text())
    assert result["smoke"] is True and result["ok"] is True and not result["errors"], (result["errors"], out[-3000:])
    # written and loaded once, in one worker; the plan's largest batch measured first
    assert result["stages_run"][:2] == ["load", "ceiling"], result["stages_run"]
    assert out.count("written and loaded") == 1
    assert result["batches"][0]["batch"] == result["plan_max"] == 4
    assert result["drop_order"] == ["graphs_off", "int8", "stt", "server", "search"]
    for b in result["ticks"]:
        assert "error" not in b, b
        assert 0 < b["tick_p50_ms"] <= b["tick_p99_ms"]
        assert b["partial_tick_p50_ms"] is None or b["partial_tick_p50_ms"] > 0
    assert result["graphs_off"]["graphs"] == "off" and "error" not in result["graphs_off"]
    assert result["stt"] is not None and "error" not in result["stt"] and result["stt"]["stt"] is True
    under = [b["batch"] for b in result["ticks"] if b["tick_p99_ms"] < 80]
    assert result["largest_batch_under_80ms"] == max(under, default=0)
    if "int8" not in result:  # this build has no frontend.weights: said, not failed
        assert any(n.startswith("int8: skipped") for n in result["notes"]), result["notes"]
    server = result["server"]
    assert server is not None and "error" not in server, server
    assert server["sessions"] == max(1, result["largest_batch_under_80ms"])
    assert server["sessions_with_audio"] == server["sessions"]
    assert server["rtf_min"] > 0.5 and server["first_audio_median_ms"] is not None and server["lateness_p99_ms"] is not None
    cpu = server["thread_cpu_pct_of_core"]
    assert cpu["event_loop"] > 0 and cpu["kame-engine"] > 0, cpu
    assert result["elapsed_s"] < 240


def _empty_python(where: Path) -> Path:
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(where)
    return where / "bin" / "python"


def test_a_box_without_torch_or_numpy_gets_a_result_saying_so(tmp_path: Path) -> None:
    py = _empty_python(tmp_path / "empty")
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([str(py), str(ROOT / "bench" / "gpu_check.py"), "all", "--out", str(out), "--work", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    result = json.loads(out.read_text())
    assert result["ok"] is False and result["missing"] == ["torch", "numpy"], result
    assert "missing torch; numpy" in proc.stderr


def test_a_box_with_torch_but_no_numpy_gets_a_result_saying_so(tmp_path: Path) -> None:
    py = make_bare_python(tmp_path / "bare", numpy=False)
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([str(py), str(ROOT / "bench" / "gpu_check.py"), "all", "--smoke", "--out", str(out),
                           "--work", str(tmp_path / "w")], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert json.loads(out.read_text())["missing"] == ["numpy"]


def test_another_python_than_the_wheels_gets_a_result_saying_so(tmp_path: Path) -> None:
    py = make_bare_python(tmp_path / "bare")
    out = tmp_path / "gpu_check.json"
    other = "3.10" if sys.version_info[:2] != (3, 10) else "3.13"
    proc = subprocess.run([str(py), str(ROOT / "bench" / "gpu_check.py"), "all", "--smoke", "--out", str(out),
                           "--work", str(tmp_path / "w")], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "GPU_CHECK_PYTHON": other})
    assert proc.returncode == 2, proc.stderr
    result = json.loads(out.read_text())
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert len(result["missing"]) == 1 and result["missing"][0].startswith(f"python {other} "), result
    assert f"--python-version {have}" in result["missing"][0]
