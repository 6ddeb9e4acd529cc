"""Echo cancellation bench: generated rooms, espeak far and near ends, AEC off and on (offline).

    python bench/echo.py [--rooms 0,1] [--delays 40,250] [--levels=-6,-12] [--variants off,aec3,linear+aec3]
                         [--plot [PNG]] [--json OUT] [--quick]

Needs the ``bench`` extra (pyroomacoustics; matplotlib for ``--plot``) and the ``mic`` extra
(livekit); espeak-ng and sox.

Each condition is one room (pyroomacoustics shoe-box rooms, image source method, at 24 kHz), one
delay (the playback and capture latency, prepended to the room's response) and one echo level (the
echo's RMS relative to what the loudspeaker plays). The loudspeaker clips softly (tanh: its
nonlinearity), the microphone adds background noise (-55 dBFS white noise). The canceller's
reference is what ``kame mic`` hands the sound card, i.e. the signal *before* the loudspeaker's
clipping, which the canceller never sees.

The far end (the assistant) speaks espeak-ng sentences with known text at -20 dBFS; the near end
(the user) speaks two sentences over it (double talk) from 4 s, at the same level at the
microphone, and the assistant goes on for 3 s after the user stops. The microphone signal goes
through :class:`kame.audio.echo.EchoCanceller` block by block (80 ms, kame's frame) as ``kame mic`` does,
as fast as it runs (the canceller does not need real time: each block is what a sound card would
give).

Variants: ``off`` (the microphone as is), ``aec3`` (WebRTC AEC3 alone), ``linear+aec3`` (kame's
linear pre-canceller, :mod:`kame.audio.echo_linear`, then AEC3: ``EchoCanceller``'s default) and
``linear`` (the pre-canceller alone, for diagnosis). Measured per condition and variant:

* ERLE: the microphone's echo energy (plus noise) over the sent audio's, from 2 s to 4 s (2 s of
  far-end speech heard, before the user speaks);
* false turns/min: user turns :class:`kame.asr.vad.TurnDetector` (the server's turn detector, its
  default settings, on the sent audio at 16 kHz) opens where only the assistant speaks (before the
  user starts, or over 0.5 s after the user's last word), per minute of that time; the time of the
  first one is printed;
* recall: the share of the user's content words Whisper tiny.en (kame's CPU ASR model) finds in
  the sent audio of the double-talk window, against the same window with no echo at all (the
  echo-free run: the user and the noise only). The user says 20 content words: one missed word is
  5 points.

Targets with AEC on: ERLE >= 25 dB, no false turn, recall within 10 points of the echo-free run.

``--network``: the server's path (the experimental server canceller, ``asr.echo_canceller``). The
canceller runs on the server, its reference is the audio the server sent, and between the two lie
the network both ways and the client's jitter buffer: the delay from a reference frame to its echo
in the audio that comes back starts at each condition's ``--delays`` value and moves in steps of
20 ms (a jitter buffer growing or shrinking: 20 ms of silence played, or 20 ms skipped) every 0.5 to
1.5 s, at random, within 40-250 ms; and the client's sound card runs on its own clock, so what comes
back is resampled by ``--drift-ppm`` (+N ppm in one condition, -N in the next). The room's response
then adds no delay of its own. The variants, metrics and targets are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' support package: tests.support

from kame.asr.config import TurnConfig
from kame.asr.resample import ASR_RATE, StreamResampler
from kame.asr.vad import TurnDetector, TurnStart
from kame.audio.echo import EchoCanceller, EchoPath
from kame.audio.echo_linear import LinearEchoCanceller
from tests.support.speech import RATE, content_recall, content_words, synthesize

FRAME = 1920
FAR_TEXT = [
    "The capital of France is Paris, a city on the river Seine.",
    "It has about two million people and many famous museums.",
    "The Eiffel Tower was built for the world fair in eighteen eighty nine.",
    "Every year millions of visitors climb its stairs or take the lifts to the top.",
    "From there you can see the whole city, the parks and the old bridges.",
    "In the evening the tower sparkles with thousands of small lights.",
]
USER_TEXT = ("Please tell me about the weather in Berlin tomorrow morning. "
             "I want to go cycling along the river with two friends, and we need to know whether it will rain before noon.")
USER_START_S = 4.0
AFTER_USER_S = 3.0  #: the assistant goes on alone after the user's last word
VARIANTS = ("off", "aec3", "linear+aec3", "linear")


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
    return (np.tanh(2.0 * x) / 2.0).astype(np.float32)


def at_dbfs(x: np.ndarray, dbfs: float) -> np.ndarray:
    return x * (10 ** (dbfs / 20) / np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-20))


@dataclass
class Scene:
    far: np.ndarray  #: what kame mic plays (the canceller's reference), the whole run
    user: np.ndarray  #: the user's voice at the microphone, the whole run
    user_start: int
    user_end: int  #: the user's last voiced sample

    @property
    def seconds(self) -> float:
        return self.far.size / RATE

    def far_only(self) -> list[slice]:
        """Where only the assistant speaks: before the user, and from 0.5 s after the user's last word."""
        return [slice(0, self.user_start), slice(min(self.user_end + RATE // 2, self.far.size), self.far.size)]

    def double_talk(self) -> slice:
        return slice(self.user_start, min(self.user_end + int(0.3 * RATE), self.far.size))


def scene() -> Scene:
    user = at_dbfs(synthesize(USER_TEXT, voice="en-us+f3", speed=170), -20).astype(np.float32)
    voiced = np.flatnonzero(np.abs(user) > 1e-4)
    start = int(USER_START_S * RATE)
    total = start + int(voiced[-1]) + 1 + int(AFTER_USER_S * RATE)
    far = np.concatenate([synthesize(t) for t in FAR_TEXT])
    if far.size < total:
        raise SystemExit(f"the far end ({far.size / RATE:.1f} s) is shorter than the scene ({total / RATE:.1f} s)")
    far = at_dbfs(far[:total], -20).astype(np.float32)
    near = np.zeros(total, np.float32)
    near[start : start + user.size] = user[: total - start]
    return Scene(far, near, start + int(voiced[0]), start + int(voiced[-1]) + 1)


@dataclass
class Row:
    room: str
    delay_ms: int
    echo_db: float
    variant: str
    erle_db: float
    false_turns_per_min: float
    first_false_turn_s: float | None
    recall: float
    rtf: float
    drift_ppm: float = 0.0  #: --network: the client's clock error
    network_ms: str = ""  #: --network: the range the delay moved in


class Whisper:
    def __init__(self) -> None:
        from faster_whisper import WhisperModel

        from kame.asr.whisper import default_whisper_model, model_directory

        self.model = WhisperModel(model_directory(default_whisper_model()), device="cpu", compute_type="int8",
                                  cpu_threads=os.cpu_count() or 2)

    def text(self, pcm: np.ndarray) -> str:
        import soxr

        audio = soxr.resample(pcm.astype(np.float32), RATE, ASR_RATE)
        segments, _ = self.model.transcribe(audio, language="en", beam_size=1, vad_filter=False,
                                            condition_on_previous_text=False)
        return " ".join(s.text.strip() for s in segments)


def turn_starts(sent: np.ndarray) -> list[float]:
    """When the server's turn detector (default settings) opens a user turn in ``sent``, in seconds."""
    detector = TurnDetector(TurnConfig())
    resampler = StreamResampler(RATE, ASR_RATE)
    starts: list[float] = []
    for i in range(0, sent.size, FRAME):
        for signal in detector.push(resampler.push(sent[i : i + FRAME])):
            if isinstance(signal, TurnStart):
                starts.append(min(i + FRAME, sent.size) / RATE)
    return starts


class LinearOnly:
    """The pre-canceller without AEC3 (the ``linear`` variant), in EchoCanceller's calling convention."""

    def __init__(self) -> None:
        self.frame = RATE // 100
        self.canceller = LinearEchoCanceller(RATE, self.frame)
        self._ref: list[np.ndarray] = []

    def far(self, pcm: np.ndarray) -> None:
        self._ref.append(pcm)

    def near(self, pcm: np.ndarray) -> np.ndarray:
        ref = self._ref.pop(0)
        f = self.frame
        return np.concatenate([self.canceller.process(ref[i : i + f], pcm[i : i + f]) for i in range(0, pcm.size, f)])


def make_canceller(variant: str, ns: bool, hpf: bool) -> EchoCanceller | LinearOnly | None:
    if variant == "off":
        return None
    if variant == "linear":
        return LinearOnly()
    return EchoCanceller(RATE, noise_suppression=ns, high_pass_filter=hpf, linear=variant == "linear+aec3")


def run_condition(sc: Scene, ir: np.ndarray | None, variant: str, seed: int, ns: bool = True,
                  hpf: bool = True) -> tuple[np.ndarray, np.ndarray, float]:
    """(microphone, sent, the canceller's CPU time per second of audio)."""
    rng = np.random.default_rng(seed)
    noise = (rng.standard_normal(sc.far.size) * 10 ** (-55 / 20)).astype(np.float32)
    path = EchoPath(ir, FRAME) if ir is not None else None
    canceller = make_canceller(variant, ns, hpf)
    played = speaker_nonlinearity(sc.far)  # what the loudspeaker makes of it
    mic_parts, sent_parts = [], []
    cpu = 0.0
    for i in range(0, sc.far.size - FRAME + 1, FRAME):
        echo = path.play(played[i : i + FRAME]) if path is not None else np.zeros(FRAME, np.float32)
        mic = np.clip(sc.user[i : i + FRAME] + echo + noise[i : i + FRAME], -1, 1).astype(np.float32)
        sent = mic
        if canceller is not None:
            t0 = time.process_time()
            canceller.far(sc.far[i : i + FRAME])  # the reference: what kame mic plays, before the speaker
            sent = canceller.near(mic)
            cpu += time.process_time() - t0
        mic_parts.append(mic)
        sent_parts.append(sent)
    mic_all = np.concatenate(mic_parts)
    return mic_all, np.concatenate(sent_parts), cpu / (mic_all.size / RATE)


def network_delays(n: int, start_ms: int, seed: int, lo_ms: int = 40, hi_ms: int = 250,
                   step_ms: int = 20) -> np.ndarray:
    """The delay (samples) from the server sending sample i to the client playing it, for every sample: a
    random walk of ``step_ms`` steps every 0.5-1.5 s within ``lo_ms``-``hi_ms`` (every step a whole
    ``step_ms``: at a bound the walk turns back), from ``start_ms``."""
    rng = np.random.default_rng(seed)
    d = np.empty(n, np.int64)
    at, ms = 0, int(np.clip(start_ms, lo_ms, hi_ms))
    while at < n:
        length = int(rng.uniform(0.5, 1.5) * RATE)
        d[at : at + length] = ms * RATE // 1000
        at += length
        step = step_ms * int(rng.choice((-1, 1)))
        ms = ms + step if lo_ms <= ms + step <= hi_ms else ms - step  # at a bound it turns back
    return d


def network_played(sent: np.ndarray, delays: np.ndarray) -> np.ndarray:
    """What the client plays: ``sent`` delayed by ``delays``; where the delay grows the jitter buffer plays
    silence, where it shrinks the samples in between are skipped (never played twice)."""
    src = np.arange(sent.size) - delays
    newest = np.maximum.accumulate(np.concatenate([[-1], src[:-1]]))
    ok = (src >= 0) & (src > newest)
    out = np.zeros(sent.size, np.float32)
    out[ok] = sent[src[ok]]
    return out


def drifted(x: np.ndarray, ppm: float) -> np.ndarray:
    """``x`` as captured by a sound card whose clock runs ``ppm`` fast (resampled), cut or padded to its length."""
    import soxr

    y = soxr.resample(x.astype(np.float32), RATE, RATE * (1 + ppm * 1e-6)).astype(np.float32)
    return np.pad(y, (0, max(0, x.size - y.size)))[: x.size]


def run_network_condition(sc: Scene, ir: np.ndarray, delays: np.ndarray, ppm: float, variant: str, seed: int,
                          ns: bool = True, hpf: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The server's path: (what reaches the server, its echo alone, what the canceller feeds Moshi and the ASR,
    the canceller's CPU time per second of audio). The canceller's reference is what the server sent."""
    rng = np.random.default_rng(seed)
    noise = (rng.standard_normal(sc.far.size) * 10 ** (-55 / 20)).astype(np.float32)
    played = speaker_nonlinearity(network_played(sc.far, delays))
    echo_client = np.convolve(played, ir)[: played.size].astype(np.float32)
    echo = drifted(echo_client, ppm)
    mic_all = np.clip(drifted(sc.user, ppm) + echo + noise, -1, 1).astype(np.float32)
    canceller = make_canceller(variant, ns, hpf)
    cpu = 0.0
    sent_parts = []
    for i in range(0, sc.far.size - FRAME + 1, FRAME):
        mic = mic_all[i : i + FRAME]
        out = mic
        if canceller is not None:
            t0 = time.process_time()
            canceller.far(sc.far[i : i + FRAME])  # the reference: what the server sent
            out = canceller.near(mic)
            cpu += time.process_time() - t0
        sent_parts.append(out)
    sent = np.concatenate(sent_parts)
    return mic_all[: sent.size], echo[: sent.size], sent, cpu / (sent.size / RATE)


def parse_list(text: str, kind: type) -> list:
    return [kind(v) for v in text.split(",") if v.strip()]


def envelope_db(x: np.ndarray, hop: int = RATE // 20) -> np.ndarray:
    n = x.size // hop
    return 10 * np.log10(np.mean(x[: n * hop].astype(np.float64).reshape(n, hop) ** 2, axis=1) + 1e-12)


def plot(path: Path, rows: list[Row], clean_recall: float, trace: dict[str, np.ndarray], trace_name: str,
         sc: Scene, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = list(dict.fromkeys((r.room.split(" ")[0], r.delay_ms, r.echo_db) for r in rows))
    variants = [v for v in VARIANTS if any(r.variant == v for r in rows)]
    labels = [f"{c[0]}\n{c[1]} ms\n{c[2]:.0f} dB" for c in conds]
    fig, axes = plt.subplots(3, 1, figsize=(11, 11))
    width = 0.8 / max(1, len(variants))
    x = np.arange(len(conds))
    for j, v in enumerate(variants):
        by = {(r.room.split(" ")[0], r.delay_ms, r.echo_db): r for r in rows if r.variant == v}
        axes[0].bar(x + j * width, [by[c].erle_db if c in by else 0 for c in conds], width, label=v)
        axes[1].bar(x + j * width, [by[c].recall if c in by else 0 for c in conds], width, label=v)
    axes[0].axhline(25, color="k", ls="--", lw=1, label="target 25 dB")
    axes[0].set_ylabel("ERLE after 2 s (dB)")
    axes[1].axhline(clean_recall, color="g", lw=1, label=f"echo-free {clean_recall:.2f}")
    axes[1].axhline(clean_recall - 0.10, color="k", ls="--", lw=1, label="target: within 10 points")
    axes[1].set_ylabel("user word recall (double talk)")
    axes[1].set_ylim(0, 1.05)
    for ax in axes[:2]:
        ax.set_xticks(x + width * (len(variants) - 1) / 2, labels, fontsize=8)
        ax.legend(fontsize=8, ncol=3)
    t = np.arange(trace["microphone echo"].size) / 20
    for name, env in trace.items():
        axes[2].plot(t, env, lw=1, label=name)
    for s in (sc.user_start, sc.user_end):
        axes[2].axvline(s / RATE, color="grey", ls=":", lw=1)
    axes[2].set_xlabel("s (dotted: the user's speech)")
    axes[2].set_ylabel("dBFS (50 ms)")
    axes[2].set_title(f"{trace_name} (the least echo removed): the echo at the microphone and what is sent "
                      "(with the user's voice between the dotted lines)", fontsize=9)
    axes[2].legend(fontsize=8, ncol=3)
    fig.suptitle(f"bench/echo.py: {subtitle}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="one room, one delay, one level (the office, 150 ms, -6 dB)")
    ap.add_argument("--rooms", default="0,1", help=f"room indices: {', '.join(f'{i} {r.name}' for i, r in enumerate(ROOMS))}")
    ap.add_argument("--delays", default="40,250", help="delays in ms, comma-separated")
    ap.add_argument("--levels", default="-6,-12", help="echo levels in dB under what the speaker plays")
    ap.add_argument("--variants", default="off,aec3,linear+aec3", help=f"any of {', '.join(VARIANTS)}")
    ap.add_argument("--network", action="store_true",
                    help="the server's path: a network delay that moves in 20 ms steps within 40-250 ms "
                    "(from each --delays value) and clock drift (--drift-ppm)")
    ap.add_argument("--step-ms", type=int, default=20, help="with --network: the delay's steps (0: it stays put)")
    ap.add_argument("--drift-ppm", type=float, default=100.0, help="with --network: the client's clock error, "
                    "+ in one condition and - in the next")
    ap.add_argument("--no-ns", action="store_true", help="AEC3 variants without the module's noise suppression")
    ap.add_argument("--no-hpf", action="store_true", help="AEC3 variants without its high-pass filter")
    ap.add_argument("--plot", nargs="?", type=Path, const=ROOT / "docs" / "echo_bench.png", default=None,
                    help="write a figure (default docs/echo_bench.png)")
    args = ap.parse_args()
    t_start = time.monotonic()
    rooms = [ROOMS[0]] if args.quick else [ROOMS[i] for i in parse_list(args.rooms, int)]
    delays = [150] if args.quick else parse_list(args.delays, int)
    levels = [-6.0] if args.quick else parse_list(args.levels, float)
    variants = parse_list(args.variants, str)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}: choose from {', '.join(VARIANTS)}")
    ns, hpf = not args.no_ns, not args.no_hpf

    sc = scene()
    whisper = Whisper()
    far_only_s = sum(s.stop - s.start for s in sc.far_only()) / RATE
    dt = sc.double_talk()
    n_words = len(content_words(USER_TEXT))

    # echo-free reference: the user and the noise only
    _, clean, _ = run_condition(sc, None, "off", seed=1)
    clean_text = whisper.text(clean[dt])
    clean_recall = content_recall(USER_TEXT, clean_text)
    clean_turns = turn_starts(clean)
    print(f"scene: {sc.seconds:.1f} s, user {sc.user_start / RATE:.2f}-{sc.user_end / RATE:.2f} s "
          f"({n_words} content words), assistant alone {far_only_s:.1f} s")
    print(f"echo-free: recall {clean_recall:.2f} ({clean_text!r}); turns at {clean_turns}")

    rows: list[Row] = []
    trace: dict[str, np.ndarray] = {}
    trace_name = ""
    worst = float("inf")  # the plot's trace: the condition where a canceller left the most echo
    cond_index = 0
    for room in rooms:
        base = room_ir(room)
        for delay in delays:
            for level in levels:
                ir = np.concatenate([np.zeros(0 if args.network else int(delay * RATE / 1000)), base])
                # scale the response so that the echo is `level` dB under what the speaker plays
                played = speaker_nonlinearity(sc.far)
                gain = 10 ** ((level - (db(np.convolve(played, ir)[: played.size]) - db(played))) / 20)
                ir = (ir * gain).astype(np.float32)
                cond: dict[str, np.ndarray] = {}
                cond_erle = float("inf")
                cond_index += 1
                ppm = args.drift_ppm * (1 if cond_index % 2 else -1)
                net = network_delays(sc.far.size, delay, seed=cond_index, step_ms=args.step_ms) if args.network else None
                for variant in variants:
                    if net is not None:
                        mic, echo, sent, rtf = run_network_condition(sc, ir, net, ppm, variant, seed=1, ns=ns, hpf=hpf)
                    else:
                        mic, sent, rtf = run_condition(sc, ir, variant, seed=1, ns=ns, hpf=hpf)
                        echo = mic - sc.user[: mic.size]
                    w = slice(2 * RATE, sc.user_start)
                    erle = db(echo[w]) - db(sent[w])
                    false = [t for t in turn_starts(sent)
                             if any(s.start / RATE <= t - 0.1 < s.stop / RATE for s in sc.far_only())]
                    hyp = whisper.text(sent[dt])
                    row = Row(room.name, delay, level, variant, round(erle, 1), round(len(false) / far_only_s * 60, 1),
                              false[0] if false else None, round(content_recall(USER_TEXT, hyp), 2), round(rtf, 3),
                              ppm if net is not None else 0.0,
                              f"{net.min() * 1000 // RATE}-{net.max() * 1000 // RATE}" if net is not None else "")
                    rows.append(row)
                    if not cond:
                        cond["microphone echo"] = envelope_db(echo)
                    if variant != "off":  # (off sends the microphone: its echo is the line above)
                        cond[f"sent ({variant})"] = envelope_db(sent)
                        cond_erle = min(cond_erle, erle)
                    where = (f"network from {delay} ms ({net.min() * 1000 // RATE}-{net.max() * 1000 // RATE} ms), "
                             f"{ppm:+.0f} ppm" if net is not None else f"{delay} ms")
                    print(f"{room.name} | {where} | {level:.0f} dB | {variant}: ERLE {row.erle_db} dB, "
                          f"false turns {len(false)} {false}, recall {row.recall} ({hyp!r}), CPU x RT {row.rtf}", flush=True)
                if cond_erle <= worst or not trace:
                    worst, trace = cond_erle, cond
                    trace_name = f"{room.name.split(',')[0]}, {delay} ms, {level:.0f} dB"

    took = time.monotonic() - t_start
    print()
    print(f"far end: {' '.join(FAR_TEXT)!r}; user: {USER_TEXT!r}; echo-free recall {clean_recall:.2f}; "
          f"AEC3 noise suppression {'on' if ns else 'off'}, high-pass {'on' if hpf else 'off'}")
    print(f"| room | delay | echo | canceller | ERLE after 2 s | false turns/min (first at) | user recall "
          f"(echo-free {clean_recall:.2f}) | canceller CPU x RT |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        first = f" ({r.first_false_turn_s:.2f} s)" if r.first_false_turn_s is not None else ""
        net_note = f" (network {r.network_ms} ms, {r.drift_ppm:+.0f} ppm)" if r.network_ms else ""
        print(f"| {r.room} | {r.delay_ms} ms{net_note} | {r.echo_db:.0f} dB | {r.variant} | {r.erle_db:.1f} dB | "
              f"{r.false_turns_per_min:.1f}{first} | {r.recall:.2f} | {r.rtf:.3f} |")
    for v in variants:
        if v == "off":
            continue
        on = [r for r in rows if r.variant == v]
        n = len(on)
        erle_ok = sum(r.erle_db >= 25 for r in on)
        turns_ok = sum(r.false_turns_per_min == 0 for r in on)
        recall_ok = sum(r.recall >= clean_recall - 0.10 - 1e-9 for r in on)
        print(f"{v}: ERLE >= 25 dB in {erle_ok}/{n} (min {min(r.erle_db for r in on):.1f} dB); no false turn in "
              f"{turns_ok}/{n}; recall within 10 points of echo-free in {recall_ok}/{n} "
              f"(min {min(r.recall for r in on):.2f}); CPU x RT max {max(r.rtf for r in on):.3f}")
    load = os.getloadavg()
    print(f"bench took {took:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.json:
        args.json.write_text(json.dumps({"echo_free_recall": clean_recall, "echo_free_turns": clean_turns,
                                         "user_content_words": n_words, "took_s": took,
                                         "rows": [asdict(r) for r in rows]}, indent=2))
    if args.plot:
        plot(args.plot, rows, clean_recall, trace, trace_name, sc,
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, {len(rows)} runs")
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
