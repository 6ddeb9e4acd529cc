"""A server on a tiny PersonaPlex-layout checkpoint: voices on /health, per-session voice on the Realtime and
Live wires (the official ``openai`` SDK), unknown voices refused naming the checkpoint's, and the time to the
first reply frame in /metrics. The server runs in this process (uvicorn in a thread): no shared server has a
PersonaPlex checkpoint, and a run's budget of server processes is spent."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.inprocess import InProcessServer

#: the real-time lane under xdist (tests/conftest.py): an in-process server's sessions at real time
pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def pp_server(kame_cache_dir: Path, tiny_personaplex_ckpt: Path) -> Iterator[InProcessServer]:
    from kame.frontend.moshi_gate import install_gate_check, remove_gate_check

    install_gate_check()  # every session of this module: each call into moshi inside kame's gate
    srv = InProcessServer(tiny_personaplex_ckpt, kame_cache_dir).start()
    try:
        yield srv
    finally:
        srv.stop()
        remove_gate_check()


def _client(server: InProcessServer) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="sk-unused")


def test_health_lists_voices(pp_server: InProcessServer) -> None:
    status, body = pp_server.get("/health")
    assert status == 200
    voices = json.loads(body)["voices"]
    assert voices == {"names": ["NATF2", "VARM1"], "default": "NATF2", "persona": True}


def test_realtime_voice_per_session_and_first_reply_metric(pp_server: InProcessServer) -> None:
    before = pp_server.metric("kame_first_reply_seconds_count")
    frame = base64.b64encode((0.05 * np.random.default_rng(0).standard_normal(480) * 32767).astype("<i2").tobytes())

    async def main() -> tuple[Any, Any, Any, int]:
        async with _client(pp_server).realtime.connect(model="personaplex") as conn:
            created = await asyncio.wait_for(conn.recv(), 10)
            await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "Nope"}}})
            refused = await asyncio.wait_for(conn.recv(), 5)
            await conn.session.update(session={"type": "realtime", "instructions": "Be kind.",
                                               "audio": {"output": {"voice": "VARM1.pt"}}})
            updated = await asyncio.wait_for(conn.recv(), 5)
            audio = 0
            for _ in range(200):  # 20 ms of audio each, faster than real time: the prompts end meanwhile
                await conn.input_audio_buffer.append(audio=frame.decode())
                await asyncio.sleep(0.01)
                try:
                    while True:
                        event = await asyncio.wait_for(conn.recv(), 0.001)
                        if event.type in ("response.output_audio.delta", "kame.output_audio.delta"):
                            audio += 1
                except asyncio.TimeoutError:
                    pass
                if audio >= 3:
                    break
        return created, refused, updated, audio

    created, refused, updated, audio = asyncio.run(main())
    assert created.session.audio.output.voice == "NATF2"  # the default voice
    assert refused.type == "error" and refused.error.code == "invalid_value"
    assert "NATF2, VARM1" in refused.error.message
    assert updated.type == "session.updated" and updated.session.audio.output.voice == "VARM1"
    assert updated.session.instructions == "Be kind."
    assert audio >= 3
    deadline = asyncio.run(_wait_metric(pp_server, "kame_first_reply_seconds_count", before + 1))
    assert deadline


async def _wait_metric(server: InProcessServer, name: str, at_least: float, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.1)):
        if server.metric(name) >= at_least:
            return True
        await asyncio.sleep(0.1)
    return False


def test_live_voice_at_start_and_unknown_voice_refused(pp_server: InProcessServer) -> None:
    async def start(voice: str) -> list[Any]:
        events: list[Any] = []
        async with _client(pp_server).live.connect() as conn:
            await conn.send({"type": "session.start", "session": {
                "model": "gpt-live-1", "instructions": "Be kind.", "audio": {"output": {"voice": voice}}}})
            async for event in conn:
                events.append(event)
                if event.type in ("session.started", "error"):
                    break
        return events

    ok = asyncio.run(start("VARM1"))[-1]
    assert ok.type == "session.started" and ok.session.audio.output.voice == "VARM1"
    refused = asyncio.run(start("NOPE"))[-1]
    assert refused.type == "error" and refused.error.code == "invalid_value"
    assert "NATF2, VARM1" in refused.error.message


def test_kame_mic_sends_its_voice(pp_server: InProcessServer, tmp_path: Path) -> None:
    """``kame mic --voice`` reaches the session: an unknown one comes back refused, naming the voices (a known
    one is applied the same way: the Realtime test above)."""
    import subprocess
    import sys

    from kame.audio.files import write_wav

    wav_in, wav_out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(wav_in, (0.05 * np.random.default_rng(1).standard_normal(24000)).astype(np.float32))
    res = subprocess.run(
        [sys.executable, "-m", "kame.cli", "mic", "--server", pp_server.http_url, "--voice", "NOPE",
         "--input-wav", str(wav_in), "--output-wav", str(wav_out), "--tail", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "'NOPE' is not one of this checkpoint's voices: NATF2, VARM1" in res.stdout + res.stderr, res.stdout[-2000:]


def test_browser_voice_picker(pp_server: InProcessServer, tmp_path: Path) -> None:
    """The page shows the checkpoint's voices, and the one picked before connecting is the session's."""
    from playwright.sync_api import sync_playwright

    from kame.audio.files import write_wav
    from tests.support.browser import BASE_ARGS, CHROMIUM, Console

    mic = tmp_path / "mic.wav"
    write_wav(mic, (0.05 * np.random.default_rng(2).standard_normal(48000)).astype(np.float32))
    console = Console()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            *BASE_ARGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={mic}"])
        try:
            page = console.watch(browser.new_page(), "personaplex")
            page.goto(pp_server.http_url + "/?transport=websocket")
            page.wait_for_function("() => document.querySelectorAll('#voice option').length === 2", timeout=15000)
            assert page.is_visible("#voice-field") and page.input_value("#voice") == "NATF2"
            assert "persona" in page.inner_text("label[for=instructions]")
            page.select_option("#voice", "VARM1")
            page.click("#connect")
            page.wait_for_function("() => window.kame.session?.audio?.output?.voice === 'VARM1'", timeout=20000)
            page.select_option("#voice", "NATF2")  # while live: an update, and the session says so
            page.wait_for_function("() => window.kame.session?.audio?.output?.voice === 'NATF2'", timeout=20000)
        finally:
            browser.close()
    assert console.errors == [], console.errors


def _chat_notices(server: InProcessServer, voice_prompt: str) -> list[str]:
    """The 0x05 notices of an ``/api/chat`` session that asks for ``voice_prompt`` (and kame's messages)."""
    import asyncio
    import contextlib
    import urllib.parse

    import websockets

    query = urllib.parse.urlencode({"voice_prompt": voice_prompt, "text_prompt": "You are a pirate.",
                                    "kame_messages": "1"})

    async def main() -> list[bytes]:
        got: list[bytes] = []
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/api/chat?{query}") as ws:
            got.append(bytes(await asyncio.wait_for(ws.recv(), 30)))
            with contextlib.suppress(asyncio.TimeoutError):
                while len(got) < 6:
                    got.append(bytes(await asyncio.wait_for(ws.recv(), 0.5)))
        return got

    got = asyncio.run(main())
    assert got[0] == b"\x00", got[:2]
    return [m[1:].decode() for m in got if m[:1] == b"\x05"]


def test_chat_voice_prompt_chooses_the_voice_or_falls_back_with_a_notice(pp_server: InProcessServer) -> None:
    """``/api/chat?voice_prompt=NAME.pt`` (PersonaPlex's clients): a known voice is taken without a word; an
    unknown one gets the default voice and one 0x05 notice naming the checkpoint's voices."""
    known = _chat_notices(pp_server, "VARM1.pt")
    assert not any("voice" in n for n in known), known
    unknown = _chat_notices(pp_server, "NOPE.pt")
    voice_notices = [n for n in unknown if n.startswith("voice_prompt:")]
    assert len(voice_notices) == 1, unknown
    assert "'NOPE.pt'" in voice_notices[0] and "NATF2, VARM1" in voice_notices[0] and "using 'NATF2'" in voice_notices[0]
