"""The real server (CPU demo config, tiny model) driven over /api/chat by Moshi-protocol clients.

One server (tests/support/servers.py ``LIMITS``, shared with test_abuse.py; 8 sessions); every client paces its audio
at real time, as a microphone would.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from tests.support.moshi_client import FRAME, MoshiClient, ServerProcess, run_session
from tests.support.speech import silence, synthesize

QUESTION = "Hello there. What is the capital of France?"


@pytest.fixture(scope="module")
def sessions_at_start(limits_server: ServerProcess) -> float:
    """Sessions the shared server counted before this module's tests (test_metrics_exposition reads a delta)."""
    return limits_server.metric("kame_sessions_total")


@pytest.fixture(scope="module")
def server(limits_server: ServerProcess, sessions_at_start: float) -> ServerProcess:
    """tests/support/servers.py ``LIMITS``: the CPU demo without ASR, eight slots, low client limits."""
    return limits_server


def _wait_all_free(server: ServerProcess, timeout: float = 5.0) -> None:
    """Slots of sessions that just closed are reset by the engine thread within a tick or so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sessions = server.get_json("/health")[1]["sessions"]
        if sessions["free"] == sessions["max"] and sessions["active"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"slots not all free after {timeout} s: {sessions}")


def _noise(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.05 * rng.standard_normal(int(seconds * 24000))).astype(np.float32)


def test_health_reports_state_sessions_device_models_backends_versions(server: ServerProcess) -> None:
    status, body = server.get_json("/health")
    assert status == 200
    assert body["status"] == "ok"
    assert body["sessions"] == {"active": 0, "max": 8, "free": 8}
    assert body["device"] == "cpu"
    # the engine as it runs: frontend.compile auto is off on CPU, and CUDA graphs exist only on CUDA
    assert body["engine"] == {"device": "cpu", "dtype": "float32", "batch_size": 8, "compile": False,
                              "cuda_graphs": False, "compiled_graphs": 0}
    assert body["models"]["frontend"]["checkpoint"] == "tiny:0"
    assert body["models"]["frontend"]["loaded"] is True
    assert body["models"]["asr"]["kind"] == "none"
    assert body["backends"] == {"default": "scripted", "names": ["scripted"]}
    assert {"torch", "moshi", "kame", "python"} <= set(body["versions"])
    status, ready = server.get_json("/ready")
    assert status == 200 and ready["ready"] is True
    status, backends = server.get_json("/v1/backends")
    assert status == 200 and backends["backends"][0]["name"] == "scripted"
    assert backends["backends"][0]["reachable"] is True


def test_spoken_question_gets_audio_and_text_at_real_time(server: ServerProcess) -> None:
    """An espeak question, paced at real time; the reply streams back at real time.

    TODO(asr): once the Whisper ASR is wired into Tandem, start this test's
    server with ``asr.kind: whisper`` and assert the transcript / oracle
    events (e.g. via ``server.record_dir``'s events.jsonl or /metrics).
    """
    pcm = np.concatenate([synthesize(QUESTION), silence(1.0)])

    async def main() -> MoshiClient:
        return await run_session(server.ws_url, pcm, query={"text_temperature": "0.6", "text_topk": "20"})

    client = asyncio.run(main())
    s = client.stats
    assert client.errors == []
    assert s.handshake_t is not None
    assert s.audio_received_s >= 0.9 * s.audio_sent_s, (s.audio_received_s, s.audio_sent_s)
    # real time, with bounds that hold on a shared 2-core machine under load (a server stepping
    # slower than its input still fails them; bench/server_load.py measures cadence properly)
    assert s.rtf >= 0.6, s.rtf
    assert s.time_to_first_audio_s is not None and s.time_to_first_audio_s < 1.5
    assert client.texts, "the model's text pieces come as 0x02 messages"
    assert all("\u2581" not in t for t in client.texts)
    assert np.isfinite(client.received_pcm()).all()


def test_eight_sessions_then_the_ninth_is_refused_and_counted(server: ServerProcess) -> None:
    _wait_all_free(server)
    rejected_before = server.metric("kame_sessions_rejected_total", 'reason="full"')

    async def main() -> tuple[list[MoshiClient], MoshiClient, tuple[int, str], list[int]]:
        clients = await asyncio.gather(*[MoshiClient.connect(server.ws_url) for _ in range(8)])
        assert all(await asyncio.gather(*[c.wait_handshake(15) for c in clients]))
        ready_status = (await asyncio.to_thread(server.get, "/ready"))[0]
        health = (await asyncio.to_thread(server.get_json, "/health"))[1]
        extra = await MoshiClient.connect(server.ws_url)
        extra_closed = await extra.wait_closed(5)
        # two of the eight send 20 ms pages (browser style), the rest 80 ms frames
        sends = [
            c.send_pcm(_noise(3.0, i), chunk=480 if i < 2 else FRAME) for i, c in enumerate(clients)
        ]
        await asyncio.gather(*sends)
        await asyncio.gather(*[c.drain_output(3.0, until_complete=True) for c in clients])
        await asyncio.gather(*[c.close() for c in clients])
        return clients, extra, extra_closed, [ready_status, health["sessions"]["active"], health["sessions"]["free"]]

    clients, extra, (code, reason), (ready_status, active, free) = asyncio.run(main())
    assert ready_status == 503
    assert (active, free) == (8, 0)
    assert (code, reason) == (1013, "server full, retry later")
    assert not extra.handshake.is_set()
    assert extra.errors == ["server full, retry later"]  # as a 0x05 message before the close
    assert server.metric("kame_sessions_rejected_total", 'reason="full"') == rejected_before + 1
    for c in clients:
        assert c.errors == []
        assert c.stats.audio_received_s >= 0.97 * c.stats.audio_sent_s, (c.stats.audio_received_s, c.stats.audio_sent_s)

    # every slot was reset and can be taken again
    _wait_all_free(server)

    async def reuse() -> bool:
        again = await asyncio.gather(*[MoshiClient.connect(server.ws_url) for _ in range(8)])
        ok = all(await asyncio.gather(*[c.wait_handshake(15) for c in again]))
        await asyncio.gather(*[c.close() for c in again])
        return ok

    assert asyncio.run(reuse())


@pytest.mark.parametrize(
    ("bad_message", "code", "error_fragment"),
    [
        (b"\x42\x00\x01", 1002, "unknown message kind 0x42"),
        ("hello, I am text", 1003, "text websocket frames"),
        (b"\x01" + b"this is not an Ogg page at all. " * 8, 1007, "corrupt Ogg/Opus"),
    ],
    ids=["unknown-kind", "text-frame", "corrupt-opus"],
)
def test_malformed_message_ends_only_that_session(
    server: ServerProcess, bad_message: bytes | str, code: int, error_fragment: str
) -> None:
    _wait_all_free(server)

    async def main() -> tuple[MoshiClient, MoshiClient]:
        steady = await MoshiClient.connect(server.ws_url)
        bad = await MoshiClient.connect(server.ws_url)
        assert await steady.wait_handshake(15) and await bad.wait_handshake(15)

        async def misbehave() -> None:
            await bad.send_pcm(_noise(0.8, 7))
            await bad.send_raw(bad_message)
            await bad.wait_closed(5)

        await asyncio.gather(steady.send_pcm(_noise(3.0, 1)), misbehave())
        await steady.drain_output(3.0, until_complete=True)
        await steady.close()
        return steady, bad

    steady, bad = asyncio.run(main())
    assert bad.close_code == code
    assert any(error_fragment in e for e in bad.errors), bad.errors
    # the well-behaved session kept its cadence and got all its audio
    assert steady.errors == []
    assert steady.close_code == 1000
    assert steady.stats.audio_received_s >= 0.97 * steady.stats.audio_sent_s
    assert steady.stats.max_gap_s(start=2) < 1.0, steady.stats.max_gap_s(start=2)
    assert server.get_json("/health")[1]["status"] == "ok"


def test_invalid_query_parameter_is_refused_with_a_reason(server: ServerProcess) -> None:
    async def main() -> MoshiClient:
        c = await MoshiClient.connect(server.ws_url, query={"text_temperature": "hot"})
        await c.wait_closed(5)
        return c

    c = asyncio.run(main())
    assert c.close_code == 1008
    assert not c.handshake.is_set()
    assert any("text_temperature" in e for e in c.errors)


def test_metrics_exposition(server: ServerProcess, sessions_at_start: float) -> None:
    status, body = server.get("/metrics")
    assert status == 200
    for name in (
        "kame_sessions_active",
        "kame_sessions_total",
        "kame_sessions_rejected_total",
        "kame_step_seconds",
        "kame_frame_lateness_seconds",
        "kame_llm_ttft_seconds",
        "kame_llm_errors_total",
        "kame_oracle_resets_total",
        "kame_oracle_tokens_total",
        "kame_asr_partial_latency_seconds",
    ):
        assert f"# TYPE {name} " in body, name
    assert server.metric("kame_step_seconds_count") > 0
    assert server.metric("kame_frame_lateness_seconds_count") > 0
    assert server.metric("kame_sessions_total") - sessions_at_start >= 9
    assert server.metric("kame_sessions_active") == 0


def test_one_server_info_message_right_after_the_handshake(server: ServerProcess) -> None:
    """Kyutai's web client validates 0x04 against its server-info schema: one message, that shape."""
    import json

    import websockets

    from tests.support.kyutai_protocol import assert_kyutai_server_info

    async def main() -> tuple[list[bytes], list[bytes]]:
        url = server.ws_url + "?text_temperature=0.45&text_topk=10"
        async with websockets.connect(url) as ws:
            first = [bytes(await asyncio.wait_for(ws.recv(), 15)) for _ in range(2)]
            rest: list[bytes] = []
            # a second of audio: nothing but audio and text follows
            import sphn

            writer = sphn.OpusStreamWriter(24000)
            for i in range(12):
                ogg = writer.append_pcm(_noise(0.08, i))
                if ogg:
                    await ws.send(b"\x01" + ogg)
                await asyncio.sleep(0.08)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                try:
                    rest.append(bytes(await asyncio.wait_for(ws.recv(), 0.2)))
                except asyncio.TimeoutError:
                    break
            return first, rest

    first, rest = asyncio.run(main())
    assert first[0] == b"\x00"
    assert first[1][0] == 0x04
    info = json.loads(first[1][1:])
    assert_kyutai_server_info(info)
    assert info["text_temperature"] == 0.45 and info["text_topk"] == 10  # this session's text sampling
    assert info["audio_topk"] == 250 and info["audio_temperature"] == 0.8  # the checkpoint's lm_gen_config
    assert info["lm_model_file"] == "tiny:0"
    assert "/" not in info["lm_model_file"]
    assert rest and {m[0] for m in rest} <= {0x01, 0x02}


def test_a_refused_session_gets_the_reason_as_text_before_the_close(server: ServerProcess) -> None:
    async def main() -> MoshiClient:
        c = await MoshiClient.connect(server.ws_url, query={"backend": "no-such-backend"})
        await c.wait_closed(5)
        return c

    c = asyncio.run(main())
    assert c.close_code == 1008 and not c.handshake.is_set()
    assert len(c.errors) == 1 and "no-such-backend" in c.errors[0]
