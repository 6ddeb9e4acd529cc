"""The Docker image, built and served: run on its own by scripts/test_image.sh (after the other
tests: a build beside real-time tests would break their timing), never collected by the main run
(the name is not test_*.py).

It builds the Dockerfile from a clean copy of the checkout on a local Debian bookworm base made
with mmdebstrap (no registry is reachable; the CUDA base and the GPU are not covered), giving pip
the host's CA bundle and package folders as BuildKit secrets, then checks that neither secret is in
a layer, the labels, the non-root user, the volume and the curl-less healthcheck, serves the CPU
demo in the container (host networking), talks to it with the openai SDK's Realtime client
(speech in, transcript and audio out) and stops it with a live session: a drained exit inside
Docker's 10 s. Finally the CPU compose file runs kame from the built image.

Environment (set by scripts/test_image.sh): KAME_IMAGE_DOCKER (the docker client with BuildKit).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.moshi_client import free_port
from tests.support.speech import silence, synthesize

ROOT = Path(__file__).resolve().parents[2]
DOCKER = os.environ.get("KAME_IMAGE_DOCKER", "/usr/bin/docker")
CACHE = Path(os.environ.get("KAME_IMAGE_CACHE", Path.home() / ".cache" / "kame-image"))
BASE = "kame-test-base:bookworm"  # kept between runs (like the frameworks' virtualenvs): warm builds
RUN_ID = secrets.token_hex(4)
# the module's first test includes the build (cold: a base and every dependency, minutes)
pytestmark = pytest.mark.timeout(560)


def docker(*args: str, timeout: float = 120, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env, **kw)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done


def make_base() -> None:
    """A Debian bookworm base with python3 + venv (mmdebstrap, cached as a tarball), imported once."""
    if docker("image", "inspect", BASE, check=False).returncode == 0:
        return
    tar = CACHE / "bookworm-minbase.tar"
    if tar.is_dir():  # what an earlier version of this check left (its temporary name had no .tar)
        shutil.rmtree(tar)
    if not tar.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = CACHE / "bookworm-minbase.part.tar"  # mmdebstrap writes a tarball only to a name ending in .tar
        tmp.unlink(missing_ok=True)
        subprocess.run(
            ["nice", "-n", "15", "mmdebstrap", "--quiet", "--variant=minbase",
             "--include=python3,python3-venv,ca-certificates", "bookworm", str(tmp)],
            check=True, timeout=300,
        )
        tmp.rename(tar)
    docker("import", str(tar), BASE, timeout=300)


def host_pip_sources() -> tuple[list[str], list[str]]:
    """The host pip config's find-links and extra-index-url entries that are local folders."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    links: list[str] = []
    indexes: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        for item in value.strip("'\"").split():
            path = item.removeprefix("file://")
            if not Path(path).is_dir():
                continue
            if key.endswith(".find-links") and path not in links:
                links.append(path)
            elif key.endswith(".extra-index-url") and path not in indexes:
                indexes.append(path)
    return links, indexes


@dataclass
class Built:
    tag: str
    build_s: float
    markers: tuple[str, str]  # in the CA secret and in the pip-config secret: must be in no layer
    commit: str


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image")


@pytest.fixture(scope="module")
def built(work: Path) -> Iterator[Built]:
    make_base()
    # a clean copy of the checkout: tracked and untracked-but-not-ignored files, nothing else
    ctx = work / "ctx"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (ctx / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / name)
    # the host's package folders over HTTP on loopback (pip trusts 127.0.0.1 without TLS)
    links, indexes = host_pip_sources()
    served = work / "served"
    served.mkdir()
    lines = ["[global]"]
    for i, path in enumerate(links):
        (served / f"l{i}").symlink_to(path)
    for i, path in enumerate(indexes):
        (served / f"i{i}").symlink_to(path)
    port = free_port()
    http = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory", str(served)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    if links:
        lines.append("find-links = " + " ".join(f"http://127.0.0.1:{port}/l{i}/" for i in range(len(links))))
    if indexes:
        lines.append("extra-index-url = " + " ".join(f"http://127.0.0.1:{port}/i{i}/simple" for i in range(len(indexes))))
    markers = (f"kame-ca-secret-{secrets.token_hex(8)}", f"kame-pipconf-secret-{secrets.token_hex(8)}")
    pip_conf = work / "pip.conf"
    pip_conf.write_text("\n".join([f"# {markers[1]}", *lines]) + "\n")
    ca_src = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    ca = work / "ca.pem"  # text outside BEGIN/END blocks is ignored by every PEM reader
    ca.write_text(f"{markers[0]}\n" + Path(ca_src).read_text())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    tag = f"kame-test:{RUN_ID}"
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            ["nice", "-n", "15", DOCKER, "build", "--network", "host", "--progress", "plain",
             "--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", "KAME_VERSION=test",
             "--build-arg", f"GIT_COMMIT={commit}",
             "--secret", f"id=ca,src={ca}", "--secret", f"id=pip_conf,src={pip_conf}", "-t", tag, str(ctx)],
            capture_output=True, text=True, timeout=540, env={**os.environ, "DOCKER_BUILDKIT": "1"},
        )
    finally:
        http.terminate()
        http.wait()
    build_s = time.monotonic() - t0
    (work / "build.log").write_text(r.stdout + r.stderr)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    print(f"\nimage_check: build {build_s:.0f} s", file=sys.stderr)
    try:
        yield Built(tag, build_s, markers, commit)
    finally:
        for c in docker("ps", "-aq", "--filter", f"label=kame-test-run={RUN_ID}", check=False).stdout.split():
            docker("rm", "-f", "-v", c, check=False)  # -v: its anonymous /data volume too
        docker("rmi", tag, check=False)


def inspect(tag: str) -> dict[str, Any]:
    return dict(json.loads(docker("image", "inspect", tag).stdout)[0])


def _layer_dirs(tag: str) -> list[Path] | None:
    """The image's layers as the daemon stores them (overlay2: one ``diff`` directory per layer, the
    files each layer added or changed, whiteouts included), when this process may read them; else
    None. Reading them in place costs seconds; streaming the image through ``docker save`` cost ~25."""
    graph = inspect(tag).get("GraphDriver") or {}
    data = graph.get("Data") or {}
    if graph.get("Name") != "overlay2" or not data.get("UpperDir"):
        return None
    dirs = [Path(d) for d in [data["UpperDir"], *filter(None, data.get("LowerDir", "").split(":"))]]
    return dirs if all(os.access(d, os.R_OK | os.X_OK) for d in dirs) else None


def _markers_in_layers(tag: str, markers: tuple[str, ...]) -> set[str]:
    """The markers found in any file of any layer of the image."""
    dirs = _layer_dirs(tag)
    if dirs is not None:
        found = set()
        for m in markers:  # grep: 0 found, 1 not found, 2 an error (which fails the test)
            r = subprocess.run(["grep", "-rqF", "-D", "skip", "--", m, *map(str, dirs)], capture_output=True, text=True)
            assert r.returncode in (0, 1), r.stderr[-2000:]
            if r.returncode == 0:
                found.add(m)
        return found
    # another storage driver, or layers this user may not read: every layer, streamed as a tarball
    proc = subprocess.Popen([DOCKER, "save", tag], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    tail = b""
    found = set()
    needles = [m.encode() for m in markers]
    while chunk := proc.stdout.read(1 << 20):
        buf = tail + chunk
        found |= {n.decode() for n in needles if n in buf}
        tail = buf[-64:]
    assert proc.wait() == 0
    return found


def test_no_secret_in_any_layer(built: Built) -> None:
    history = docker("history", "--no-trunc", built.tag).stdout
    assert "pip_conf" in history  # the RUN lines that mount the secrets are there ...
    for m in built.markers:
        assert m not in history
    # ... but neither the CA bundle nor the pip config (with its package server) is in a layer
    # (the scan can see: the markers' common prefix is in this file, which `COPY . .` put in a layer)
    control = built.markers[0].rsplit("-", 1)[0] + "-"
    found = _markers_in_layers(built.tag, (*built.markers, control))
    assert control in found, "the layer scan found nothing: it reads no layer"
    found.discard(control)
    assert not found, found


def test_labels_user_volume_healthcheck(built: Built) -> None:
    cfg = inspect(built.tag)["Config"]
    assert cfg["Labels"]["org.opencontainers.image.revision"] == built.commit
    assert cfg["Labels"]["org.opencontainers.image.version"] == "test"
    assert cfg["User"] == "kame"
    assert "/data" in cfg["Volumes"]
    check = " ".join(cfg["Healthcheck"]["Test"])
    assert "curl" not in check and "/health" in check
    uid = docker("run", "--rm", "--network", "host", "--entrypoint", "id", built.tag, "-u").stdout.strip()
    assert uid == "10001"
    assert docker("run", "--rm", "--network", "host", "--entrypoint", "sh", built.tag, "-c", "command -v curl", check=False).returncode != 0


def _logs_until_exit(args: list[str], timeout: float = 90) -> tuple[int, str]:
    r = docker("run", "--rm", "--network", "host", "--label", f"kame-test-run={RUN_ID}", *args, timeout=timeout, check=False)
    return r.returncode, r.stdout + r.stderr


def test_no_gpu_is_one_clear_line(built: Built) -> None:
    rc, out = _logs_until_exit(["-e", f"KAME_SERVER__PORT={free_port()}", built.tag])  # the default config: a GPU model
    assert rc != 0
    assert "no CUDA GPU found" in out and "cpu-demo" in out, out[-2000:]
    assert "Traceback" not in out


def test_missing_models_is_one_clear_line(built: Built) -> None:
    # a real checkpoint that is not on the volume, offline (as on an air-gapped box before `kame download`)
    rc, out = _logs_until_exit(["-e", f"KAME_SERVER__PORT={free_port()}", "-e", "HF_HUB_OFFLINE=1",
                                "-e", "KAME_FRONTEND__CHECKPOINT=kyutai/moshika-pytorch-bf16",
                                built.tag, "--config", "cpu-demo"])
    lines = [line for line in out.splitlines() if "is not in the local cache and HF_HUB_OFFLINE is set" in line]
    assert lines and "kame download --checkpoint kyutai/moshika-pytorch-bf16" in lines[0], out[-2000:]
    assert "Traceback" not in out
    assert rc != 0


def test_unwritable_data_is_one_clear_line(built: Built) -> None:
    # another uid than the image's: the /data volume (owned by 10001) is not writable for it
    rc, out = _logs_until_exit(["--user", "12345", "-e", f"KAME_SERVER__PORT={free_port()}", "-e", "HF_HUB_OFFLINE=1",
                                built.tag, "--config", "cpu-demo"])
    lines = [line for line in out.splitlines() if "is not writable by uid 12345" in line]
    assert lines and "/data/kame" in lines[0], out[-2000:]
    assert rc != 0


async def _talk_then_stop(port: int, name: str) -> dict[str, Any]:
    from openai import AsyncOpenAI

    q = np.concatenate([silence(0.3), synthesize("What is the capital of France?"), silence(2.5)])
    data = (np.clip(q, -1, 1) * 32767).astype("<i2").tobytes()
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    seen: dict[str, Any] = {"types": [], "audio_bytes": 0, "transcripts": [], "closed": None}
    async with client.realtime.connect(model="kame") as conn:
        assert (await asyncio.wait_for(conn.recv(), 30)).type == "session.created"

        async def speak() -> None:
            step, start = 1920, time.monotonic()
            for k, i in enumerate(range(0, len(data), step)):
                await asyncio.sleep(max(0.0, start + k * 0.04 - time.monotonic()))
                await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())

        speaker = asyncio.create_task(speak())
        stop_at: float | None = None
        stopper: asyncio.Task[Any] | None = None
        try:
            quiet_until = time.monotonic() + 30
            while True:
                # a standard client sees no events between responses (kame's are opt-in): the stop
                # condition is checked on a quiet second too, and 30 s without any event ends the loop
                try:
                    event = await asyncio.wait_for(conn.recv(), 1)
                    quiet_until = time.monotonic() + 30
                except asyncio.TimeoutError:
                    if time.monotonic() > quiet_until:
                        raise
                    if stopper is None and speaker.done() and seen["transcripts"] and seen["audio_bytes"]:
                        stop_at = time.monotonic()
                        stopper = asyncio.create_task(asyncio.to_thread(docker, "stop", name, timeout=30))
                    continue
                seen["types"].append(event.type)
                if event.type == "response.output_audio.delta":
                    seen["audio_bytes"] += len(base64.b64decode(event.delta))
                if event.type == "conversation.item.input_audio_transcription.completed":
                    seen["transcripts"].append(event.transcript)
                if stopper is None and speaker.done() and seen["transcripts"] and seen["audio_bytes"]:
                    # docker stop with this session live: SIGTERM, drain, exit before Docker's 10 s
                    stop_at = time.monotonic()
                    stopper = asyncio.create_task(asyncio.to_thread(docker, "stop", name, timeout=30))
        except Exception as e:  # the server closes the session while it drains
            seen["closed"] = repr(e)
        if stopper is not None and stop_at is not None:
            await stopper
            seen["stop_s"] = time.monotonic() - stop_at
        speaker.cancel()
    return seen


def test_serves_the_cpu_demo_and_drains_on_docker_stop(built: Built) -> None:
    port = free_port()
    name = f"kame-test-{RUN_ID}"
    docker("run", "-d", "--name", name, "--network", "host", "--label", f"kame-test-run={RUN_ID}",
           "--health-interval", "2s", "-e", f"KAME_SERVER__PORT={port}", "-e", "HF_HUB_OFFLINE=1",
           "-e", "KAME_FRONTEND__COMPILE=on", built.tag, "--config", "cpu-demo")
    deadline = time.monotonic() + 300  # inductor builds moshi's kernels with the image's g++ at warm-up
    ready = False
    while time.monotonic() < deadline and not ready:
        try:
            ready = urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200
        except OSError:
            assert docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true", docker("logs", name).stderr[-3000:]
            time.sleep(1)
    assert ready, docker("logs", name, check=False).stderr[-3000:]
    while time.monotonic() < deadline:
        health = docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
        if health != "starting":
            break
        time.sleep(1)
    assert health == "healthy", health
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        engine = json.loads(resp.read())["engine"]
    # compiled with the image's gcc, g++ and Python headers, not the eager fallback
    assert engine["compile"] is True and engine["compiled_graphs"] >= 1, (engine, docker("logs", name).stderr[-3000:])
    seen = asyncio.run(_talk_then_stop(port, name))
    logs = docker("logs", name, check=False)
    state = json.loads(docker("inspect", name).stdout)[0]["State"]
    print(f"\nimage_check: docker stop with a live session took {seen.get('stop_s', -1):.1f} s", file=sys.stderr)
    assert any("france" in t.lower() or "capital" in t.lower() for t in seen["transcripts"]), seen["transcripts"]
    assert seen["audio_bytes"] > 24000 * 2, seen["audio_bytes"]  # more than a second of reply audio
    assert "response.done" in seen["types"]
    assert seen["closed"] is not None  # the server ended the session while draining
    assert seen["stop_s"] < 10, seen
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, (logs.stdout + logs.stderr)[-3000:])


def test_compose_files_validate_and_the_cpu_compose_serves(built: Built, work: Path) -> None:
    compose = ["docker-compose"]
    r = subprocess.run([*compose, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    port = free_port()
    env = {**os.environ, "KAME_IMAGE": built.tag, "KAME_PORT_HOST": str(port), "DOCKER_BUILDKIT": "1"}
    cpu = ["-f", str(ROOT / "deploy" / "docker-compose.cpu.yml"), "-p", f"kametest{RUN_ID}"]
    r = subprocess.run([*compose, *cpu, "config", "-q"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    try:
        r = subprocess.run([*compose, *cpu, "up", "-d"], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        deadline, ready = time.monotonic() + 180, False
        while time.monotonic() < deadline and not ready:
            try:
                ready = urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200
            except OSError:
                time.sleep(1)
        assert ready
        t0 = time.monotonic()
        r = subprocess.run([*compose, *cpu, "stop"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0 and time.monotonic() - t0 < 10, r.stderr
    finally:
        subprocess.run([*compose, *cpu, "down", "-v"], capture_output=True, text=True, env=env, timeout=60)
