"""kame eval's session driver against a scripted /v1/realtime peer whose answers start at known times.

The CPU demo's tiny random model emits noise, never speech, so it cannot
show that latencies are measured right. This peer speaks the protocol's
few events the driver needs (session.created/updated, one output frame per
80 ms input frame, transcript deltas, kame.oracle.* events) and answers
with a harmonic burst at a chosen offset from the user's speech, so the
latency the driver measures on its recording is known: +0.4 s for turn 1,
-0.5 s for turn 2 (it starts while the user is still speaking).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kame.audio.media import FRAME_SIZE, SAMPLE_RATE
from kame.eval.analysis import read_stereo_wav, turn_facts
from kame.eval.runner import ServerTarget
from kame.eval.session import DriveConfig, SessionError, drive_question
from kame.eval.vad import VadConfig, speech_segments, turn_latency

#: the real-time lane under xdist (tests/conftest.py): sessions at real time and latencies measured on their recordings
pytestmark = pytest.mark.realtime

RATE = SAMPLE_RATE
FRAME = FRAME_SIZE


def burst(seconds: float, amp: float = 0.3) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    x = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((150, 300, 450, 750, 1200), 1))
    return (amp * x / np.max(np.abs(x))).astype(np.float32)


def b64(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class ScriptedPeer:
    """Answers each user utterance with ``answer_s`` of sound starting ``offsets[i]`` s after the user's
    speech *ends* (negative: before it ends), counted in input frames like Moshi's clock."""

    def __init__(self, offsets: list[float], utterance_s: list[float], answer_s: float = 1.0,
                 refuse_update: bool = False) -> None:
        self.offsets = offsets
        self.utterance_s = utterance_s
        self.answer = burst(answer_s, 0.25)
        self.refuse_update = refuse_update
        self.updates: list[dict[str, Any]] = []
        self.port = 0

    async def handler(self, ws: Any) -> None:
        session = {"id": "sess_test", "kame": {"oracle_delay_s": 0.0, "server": {"x": 1}}}
        await ws.send(json.dumps({"type": "session.created", "session": session}))
        buf = np.zeros(0, np.float32)
        frame_i = 0
        turn = -1
        quiet = 99  # input frames since the user was last loud
        play_at: int | None = None
        played = 0
        async for message in ws:
            ev = json.loads(message)
            if ev["type"] == "session.update":
                self.updates.append(ev["session"])
                if self.refuse_update:
                    await ws.send(json.dumps({"type": "error", "error": {"code": "unknown_backend", "message": "no"}}))
                else:
                    session["kame"].update(ev["session"].get("kame", {}))
                    await ws.send(json.dumps({"type": "session.updated", "session": session}))
                continue
            if ev["type"] != "input_audio_buffer.append":
                continue
            buf = np.concatenate([buf, np.frombuffer(base64.b64decode(ev["audio"]), "<i2").astype(np.float32) / 32768])
            while len(buf) >= FRAME:
                frame, buf = buf[:FRAME], buf[FRAME:]
                loud = float(np.sqrt(np.mean(frame**2))) > 0.01
                if loud and quiet >= 7:  # loud after >= 0.56 s of quiet: a new utterance, schedule the answer
                    turn += 1
                    end_frame = frame_i + self.utterance_s[turn] / 0.08
                    play_at = round(end_frame + self.offsets[turn] / 0.08)
                    played = 0
                    await ws.send(json.dumps({"type": "kame.oracle.reset", "request_id": turn + 1,
                                              "text": "Hello", "tokens": 2}))
                    await ws.send(json.dumps({"type": "kame.oracle.text", "request_id": turn + 1,
                                              "text": "Hello there.", "tokens": 3}))
                quiet = 0 if loud else quiet + 1
                out = np.zeros(FRAME, np.float32)
                if play_at is not None and frame_i >= play_at and played < len(self.answer):
                    out = self.answer[played : played + FRAME]
                    out = np.concatenate([out, np.zeros(FRAME - len(out), np.float32)])
                    if played == 0:
                        for piece in (" Hel", "lo", " there", "."):
                            await ws.send(json.dumps({"type": "response.output_audio_transcript.delta",
                                                      "response_id": f"resp_{turn}", "delta": piece}))
                    played += FRAME
                    kind = "response.output_audio.delta"
                else:
                    kind = "kame.output_audio.delta"
                await ws.send(json.dumps({"type": kind, "delta": b64(out)}))
                frame_i += 1


async def _with_peer(peer: ScriptedPeer, body: Any) -> Any:
    from websockets.asyncio.server import serve

    async with serve(peer.handler, "127.0.0.1", 0) as server:
        peer.port = server.sockets[0].getsockname()[1]
        return await body(f"ws://127.0.0.1:{peer.port}/v1/realtime")


def test_latency_positive_and_negative_measured_on_the_recording(tmp_path: Path) -> None:
    q1, q2 = burst(2.0), burst(1.6)
    peer = ScriptedPeer(offsets=[0.4, -0.5], utterance_s=[2.0, 1.6])
    cfg = DriveConfig(reply_silence_s=1.0, max_reply_s=6.0, lead_in_s=0.5, vad=VadConfig())

    async def body(url: str) -> Any:
        return await drive_question(url, [q1, q2], {"oracle_delay_s": 0.5}, cfg)

    rec = asyncio.run(_with_peer(peer, body))
    assert peer.updates[0]["kame"] == {"oracle_delay_s": 0.5}
    assert peer.updates[0]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert rec.session is not None and rec.session["kame"]["oracle_delay_s"] == 0.5
    assert [t.reply_end for t in rec.turns] == ["silence", "silence"]
    t1, t2 = rec.turns
    assert t1.start_s == 0.0 and t1.speech_start_s == 0.5 and t1.question_end_s == 2.5
    # turn 1: answer 0.4 s after the user, 1 s long, then >= 1 s of silence ends the reply
    assert t1.end_s == pytest.approx(2.5 + 0.4 + 1.0 + 1.0, abs=0.35)
    assert t2.start_s == t1.end_s
    assert rec.audio_s == pytest.approx(t2.end_s, abs=0.01)

    facts = turn_facts(rec, tmp_path / "q1", tmp_path, VadConfig())
    lat = [f["latency_s"] for f in facts]
    # +-0.1 s: VAD frames are 30 ms, frames 80 ms, plus delivery on a loaded machine
    assert lat[0] == pytest.approx(0.4, abs=0.12)
    assert lat[1] == pytest.approx(-0.5, abs=0.12)
    assert facts[0]["user_end_s"] == pytest.approx(2.5, abs=0.05)
    assert [f["assistant_text"] for f in facts] == ["Hello there.", "Hello there."]
    assert [len(f["oracle_answers"]) for f in facts] == [1, 1]
    oa = facts[1]["oracle_answers"][0]
    assert oa["text"] == "Hello there." and oa["resets"] == 1 and oa["tokens"] == 5
    assert t2.start_s <= oa["first_s"] <= t2.end_s

    # the latencies come from the recorded files: recompute them from the wavs
    for f, turn in zip(facts, rec.turns):
        st = read_stereo_wav(tmp_path / f["audio"])
        assert len(st) == pytest.approx((turn.end_s - turn.start_s) * RATE, abs=2)
        u, a = speech_segments(st[:, 0]), speech_segments(st[:, 1])
        again = turn_latency(u, a, 0.0, turn.end_s - turn.start_s)
        assert again.latency_s == pytest.approx(f["latency_s"], abs=0.031)
    events = [json.loads(line) for line in (tmp_path / "q1" / "events.jsonl").read_text().splitlines()]
    assert {e["type"] for e in events} >= {"kame.oracle.reset", "kame.oracle.text", "response.output_audio_transcript.delta"}
    assert all("t_s" in e for e in events)


def test_reply_is_cut_at_max_reply_when_the_assistant_never_stops(tmp_path: Path) -> None:
    peer = ScriptedPeer(offsets=[-0.3], utterance_s=[1.0], answer_s=8.0)
    cfg = DriveConfig(reply_silence_s=1.0, max_reply_s=1.5, lead_in_s=0.0)

    async def body(url: str) -> Any:
        return await drive_question(url, [burst(1.0)], {}, cfg)

    rec = asyncio.run(_with_peer(peer, body))
    (turn,) = rec.turns
    assert turn.reply_end == "max_reply"
    assert turn.end_s == pytest.approx(turn.question_end_s + 1.5, abs=0.1)


def test_refused_settings_and_unreachable_server_are_session_errors() -> None:
    peer = ScriptedPeer(offsets=[0.0], utterance_s=[1.0], refuse_update=True)

    async def body(url: str) -> Any:
        return await drive_question(url, [burst(1.0)], {"backend": "nope"}, DriveConfig(connect_timeout_s=5))

    with pytest.raises(SessionError, match="session.updated refused: unknown_backend"):
        asyncio.run(_with_peer(peer, body))
    with pytest.raises(SessionError, match="cannot connect"):
        asyncio.run(drive_question("ws://127.0.0.1:9/v1/realtime", [burst(1.0)], {}, DriveConfig(connect_timeout_s=2)))


@pytest.mark.parametrize(
    ("url", "ws", "health"),
    [
        ("http://127.0.0.1:8998", "ws://127.0.0.1:8998/v1/realtime", "http://127.0.0.1:8998/health"),
        ("127.0.0.1:8998/", "ws://127.0.0.1:8998/v1/realtime", "http://127.0.0.1:8998/health"),
        ("ws://h:1/v1/realtime", "ws://h:1/v1/realtime", "http://h:1/health"),
        ("https://x.org/kame/v1", "wss://x.org/kame/v1/realtime", "https://x.org/kame/health"),
    ],
)
def test_server_url_forms(url: str, ws: str, health: str) -> None:
    t = ServerTarget.parse(url)
    assert (t.ws_url, t.health_url) == (ws, health)


def test_run_set_scores_from_an_asr_transcript_of_the_reply(tmp_path: Path) -> None:
    """``--score-from asr``: the judged answer is Whisper's transcript of the recorded reply."""
    from kame.eval.questions import Question
    from kame.eval.runner import EvalConfig, Services, run_set, trim_silence
    from kame.eval.transcribe import ReplyTranscriber
    from kame.eval.tts import make_tts

    tts = make_tts("espeak")
    q = Question(7, "reasoning", ("How many brothers does David have?", "And sisters?"), ("None.", "Three."))
    speech = {q.key: [trim_silence(tts.synthesize(t)) for t in q.turns]}
    peer = ScriptedPeer(offsets=[0.3, 0.3], utterance_s=[len(p) / RATE for p in speech[q.key]])
    peer.answer = trim_silence(tts.synthesize("The capital of France is Paris."))  # tiny.en gets it right
    lines: list[str] = []

    async def body(url: str) -> Any:
        cfg = EvalConfig(target=ServerTarget.parse(url), questions=(q,), questions_source="test", tts=tts,
                         drive=DriveConfig(reply_silence_s=1.0, max_reply_s=6.0), score_from="asr")
        services = Services(None, ReplyTranscriber(), speech, {"kame": "test"}, lambda: {"kame": "here"},
                            say=lines.append)
        return await run_set(cfg, tmp_path, {}, services)

    outcome = asyncio.run(_with_peer(peer, body))
    assert not outcome.failures and outcome.sessions == 1
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["turn"] for r in rows] == [1, 2]
    for r in rows:
        assert r["score_from"] == "asr" and r["answer_judged"] == r["assistant_asr_text"]
        assert "capital of france" in r["assistant_asr_text"].lower(), r["assistant_asr_text"]
        assert r["assistant_text"] == "Hello there."  # the text stream is kept beside it
        assert 0.0 < r["latency_s"] < 1.0  # exact values: the burst test above
    assert any("q7 (reasoning)" in line for line in lines)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["versions"] == {"server": {"kame": "test"}, "local": {"kame": "here"}}


class DrainingPeer(ScriptedPeer):
    """The first session is refused (1013 "server full"), the second is drained mid-question (1001
    after ``drain_after`` input frames), the third runs normally: what a client meets during a
    rolling update behind a load balancer."""

    def __init__(self, *args: Any, drain_after: int = 10, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.connections = 0
        self.drain_after = drain_after

    async def handler(self, ws: Any) -> None:
        self.connections += 1
        if self.connections == 1:
            await ws.close(1013, "server full, retry later")
            return
        if self.connections == 2:
            await ws.send(json.dumps({"type": "session.created", "session": {"id": "sess_drained", "kame": {}}}))
            frames = 0
            async for message in ws:
                ev = json.loads(message)
                if ev["type"] == "session.update":
                    await ws.send(json.dumps({"type": "session.updated", "session": {"id": "sess_drained", "kame": {}}}))
                elif ev["type"] == "input_audio_buffer.append":
                    frames += 1
                    if frames >= self.drain_after:
                        await ws.send(json.dumps({"type": "kame.session.ending", "reason": "draining",
                                                  "seconds_left": 0.0}))
                        await ws.close(1001, "server shutting down")
                        return
            return
        await super().handler(ws)


def test_refused_and_drained_sessions_are_retried_and_recorded(tmp_path: Path) -> None:
    from kame.eval.questions import Question
    from kame.eval.runner import EvalConfig, Services, run_set
    from kame.eval.tts import make_tts

    q = Question(3, "writing", ("Say hello.",), ("Hello.",))
    speech = {q.key: [burst(1.0)]}
    peer = DrainingPeer(offsets=[0.3], utterance_s=[1.0])
    lines: list[str] = []

    async def body(url: str) -> Any:
        cfg = EvalConfig(target=ServerTarget.parse(url), questions=(q,), questions_source="test", tts=make_tts("espeak"),
                         drive=DriveConfig(reply_silence_s=0.8, max_reply_s=4.0))
        services = Services(None, None, speech, {"kame": "test"}, lambda: {}, say=lines.append)
        return await run_set(cfg, tmp_path, {}, services)

    outcome = asyncio.run(_with_peer(peer, body))
    assert not outcome.failures and outcome.sessions == 1
    assert peer.connections == 3
    (row,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["reconnects"] == 2
    assert "1013 server full" in row["reconnect_reasons"][0] and "1001 server shutting down" in row["reconnect_reasons"][1]
    assert row["session_id"] == "sess_test"  # the recorded session is the third one
    said = [line for line in lines if "reconnecting in" in line]
    assert len(said) == 2 and "a new conversation starts" in said[1] and "a new conversation" not in said[0]


def test_other_closes_are_not_retried(tmp_path: Path) -> None:
    class Refusing(ScriptedPeer):
        connections = 0

        async def handler(self, ws: Any) -> None:
            Refusing.connections += 1
            await ws.close(1008, "unauthorized")

    peer = Refusing(offsets=[0.0], utterance_s=[1.0])

    async def body(url: str) -> Any:
        return await drive_question(url, [burst(1.0)], {}, DriveConfig(connect_timeout_s=5))

    with pytest.raises(SessionError, match="1008 unauthorized") as info:
        asyncio.run(_with_peer(peer, body))
    assert info.value.retry_reason is None and info.value.close_code == 1008
