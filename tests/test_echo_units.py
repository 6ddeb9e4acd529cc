"""kame.audio.echo without a server: the canceller removes a simulated echo, keeps block lengths, gives WebRTC's
module each reference frame right before the microphone frame captured with it (a bounded queue between),
its linear pre-canceller finds the delay, converges and keeps cancelling through double talk, the switch
between the two AEC3 outputs follows the user's voice, and it refuses a reference or microphone at the wrong
rate or channel count and unusable impulse responses, in one sentence each."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

import kame.audio.echo
from kame.audio.echo import EchoCanceller, EchoInputError, EchoPath, read_impulse_response

RATE = 24000


def modulated_noise(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * np.arange(n) / RATE)
    return (0.1 * rng.standard_normal(n) * env).astype(np.float32)


def test_echo_is_removed_after_convergence() -> None:
    ir = np.zeros(int(0.2 * RATE) + 1, np.float32)
    ir[-1] = 0.5  # 200 ms, -6 dB
    path, aec = EchoPath(ir, 1920), EchoCanceller(RATE)
    far = modulated_noise(5)
    mic, out = [], []
    for i in range(0, far.size, 1920):
        block = far[i : i + 1920]
        m = path.play(block)
        aec.far(block)
        mic.append(m)
        out.append(aec.near(m))
    m, o = np.concatenate(mic)[2 * RATE :], np.concatenate(out)[2 * RATE :]
    erle = 10 * np.log10(np.mean(m**2) / np.mean(o**2))
    assert erle >= 25, erle


class _Frame:
    def __init__(self, data: bytes, rate: int, channels: int, n: int) -> None:
        self.data = bytearray(data)


class _RecordingModule:
    """Stands in for WebRTC's module: records which side each 10 ms frame went to, and its first sample."""

    made: list[_RecordingModule] = []

    def __init__(self, **_switches: bool) -> None:
        self.calls: list[tuple[str, int]] = []
        self.made.append(self)

    def _first(self, frame: _Frame) -> int:
        return int(np.frombuffer(bytes(frame.data[:2]), "<i2")[0])

    def process_reverse_stream(self, frame: _Frame) -> None:
        self.calls.append(("far", self._first(frame)))

    def process_stream(self, frame: _Frame) -> None:
        self.calls.append(("near", self._first(frame)))

    def set_stream_delay_ms(self, ms: int) -> None:
        pass


class _FakeRtc:
    AudioFrame = _Frame
    AudioProcessingModule = _RecordingModule


def _numbered(first: int, frames: int, size: int) -> np.ndarray:
    """``frames`` 10 ms frames whose samples are first, first + 1, ... (in 1/32768 steps)."""
    return np.repeat(np.arange(first, first + frames), size).astype(np.float32) / 32768


def test_each_reference_frame_goes_in_right_before_its_microphone_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kame.audio.echo, "_livekit_rtc", lambda: _FakeRtc)
    _RecordingModule.made = []
    aec = EchoCanceller(RATE, linear=False)  # the microphone as is: the module sees the numbers sent
    size = aec.frame
    for block in range(3):  # kame's 80 ms blocks: 8 frames each side
        aec.far(_numbered(100 + 8 * block, 8, size))
        aec.near(_numbered(1000 + 8 * block, 8, size))
    expected = [call for i in range(24) for call in (("far", 100 + i), ("near", 1000 + i))]
    (module,) = _RecordingModule.made
    assert module.calls == expected


def test_the_reference_queue_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kame.audio.echo, "_livekit_rtc", lambda: _FakeRtc)
    _RecordingModule.made = []
    aec = EchoCanceller(RATE, linear=False)
    size = aec.frame
    aec.far(_numbered(0, 80, size))  # 800 ms played before anything is captured
    bound = kame.audio.echo.MAX_QUEUE_MS // kame.audio.echo.FRAME_MS
    (module,) = _RecordingModule.made
    # the oldest 300 ms went in on their own, in order; the last 500 ms wait
    assert module.calls == [("far", i) for i in range(80 - bound)]
    aec.near(_numbered(1000, 2, size))
    assert module.calls[-4:] == [("far", 80 - bound), ("near", 1000), ("far", 81 - bound), ("near", 1001)]


def test_with_the_pre_canceller_both_modules_get_every_reference_frame_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kame.audio.echo, "_livekit_rtc", lambda: _FakeRtc)
    _RecordingModule.made = []
    aec = EchoCanceller(RATE, linear=True)
    size = aec.frame
    for block in range(3):
        aec.far(_numbered(100 + 8 * block, 8, size))
        aec.near(_numbered(1000 + 8 * block, 8, size))
    assert len(_RecordingModule.made) == 2
    for module in _RecordingModule.made:
        assert [side for side, _ in module.calls] == ["far", "near"] * 24
        assert [n for side, n in module.calls if side == "far"] == list(range(100, 124))


def test_echo_path_delays_and_scales() -> None:
    ir = np.zeros(100, np.float32)
    ir[99] = 0.25
    path = EchoPath(ir, 80)
    x = np.zeros(240, np.float32)
    x[0] = 1.0
    y = np.concatenate([path.play(x[i : i + 80]) for i in range(0, 240, 80)])
    assert np.argmax(np.abs(y)) == 99 and y[99] == pytest.approx(0.25, abs=1e-6)


def test_any_block_length_comes_back_the_same_length() -> None:
    aec = EchoCanceller(RATE)
    sizes = [100, 240, 333, 1920, 7]
    for n in sizes:
        aec.far(np.zeros(n, np.float32))
        assert aec.near(np.zeros(n, np.float32)).size == n
    assert aec.near_samples == sum(sizes)


def test_mismatched_reference_or_microphone_is_one_sentence() -> None:
    aec = EchoCanceller(RATE)
    with pytest.raises(EchoInputError) as exc:
        aec.far(np.zeros(480, np.float32), sample_rate=48000)
    assert "48000 Hz" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(EchoInputError) as exc:
        aec.near(np.zeros((480, 2), np.float32))
    assert "2 channel" in str(exc.value)
    with pytest.raises(EchoInputError):
        EchoCanceller(44100)
    with pytest.raises(EchoInputError):
        EchoCanceller(RATE, channels=2)
    aec.far(np.zeros(480, np.float32))  # still usable after a refused block
    assert aec.near(np.zeros(480, np.float32)).size == 480


def _wav(path: Path, data: np.ndarray, rate: int, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((data * 32767).astype("<i2").tobytes())
    return path


def test_impulse_response_files(tmp_path: Path) -> None:
    # a 48 kHz response: resampled with its delay and gain kept
    ir48 = np.zeros(9600)
    ir48[4800] = 0.5  # 100 ms
    ir = read_impulse_response(_wav(tmp_path / "a.wav", ir48, 48000), RATE)
    assert abs(int(np.argmax(np.abs(ir))) - 2400) <= 1
    x = modulated_noise(1)
    gain = np.sqrt(np.mean(np.convolve(x, ir)[3000:20000] ** 2) / np.mean(x[600:17600] ** 2))
    assert gain == pytest.approx(0.5, rel=0.05)
    bad = [
        (tmp_path / "missing.wav", "no such file"),
        (_wav(tmp_path / "s.wav", np.ones(20) * 0.1, RATE, channels=2), "2 channels"),
        (_wav(tmp_path / "z.wav", np.zeros(20), RATE), "silent"),
    ]
    (tmp_path / "t.wav").write_text("text, not a wav")
    bad.append((tmp_path / "t.wav", "not a readable wav"))
    for path, words in bad:
        with pytest.raises(EchoInputError) as exc:
            read_impulse_response(path, RATE)
        assert words in str(exc.value) and "\n" not in str(exc.value)


def test_linear_pre_canceller_finds_the_delay_converges_and_survives_double_talk() -> None:
    from kame.audio.echo_linear import LinearEchoCanceller

    frame = RATE // 100
    lin = LinearEchoCanceller(RATE, frame)
    delay = int(0.2 * RATE)
    ir = np.zeros(delay + 600)
    ir[delay] = 0.5
    ir[delay + 1 :] = 0.05 * np.random.default_rng(3).standard_normal(599) * np.exp(-np.arange(599) / 150)
    far = modulated_noise(8)
    echo = np.convolve(far, ir)[: far.size].astype(np.float32)
    near = np.zeros(far.size, np.float32)
    near[5 * RATE : 6 * RATE] = 3 * modulated_noise(1, seed=7)  # 1 s of loud double talk
    mic = echo + near
    out = np.concatenate([lin.process(far[i : i + frame], mic[i : i + frame]) for i in range(0, far.size, frame)])
    assert lin.delay is not None and abs(lin.delay - delay) <= lin.margin
    assert np.all(np.isfinite(out))

    def erle(a: int, b: int) -> float:
        w = slice(a * RATE // 10, b * RATE // 10)
        return float(10 * np.log10(np.mean(echo[w] ** 2) / np.mean((out[w] - near[w]) ** 2)))

    assert erle(40, 50) >= 20  # converged before the double talk
    assert erle(60, 70) >= 15  # and still cancelling right after it: the foreground kept its filter
    assert erle(70, 80) >= 20


def test_the_mix_sends_aec3_alone_until_its_output_carries_a_voice() -> None:
    from kame.audio.echo import _Mix

    mix = _Mix()
    size = RATE // 100
    rng = np.random.default_rng(0)
    mic = (0.1 * rng.standard_normal(size)).astype(np.float32)
    quiet = (1e-4 * rng.standard_normal(size)).astype(np.float32)  # AEC3 alone: the echo removed
    leaky = (3e-3 * rng.standard_normal(size)).astype(np.float32)  # after the pre-canceller: some left
    for _ in range(50):  # the assistant alone: the quieter output goes out
        out = mix.frame(mic, quiet, leaky)
    assert np.array_equal(out, quiet)
    voice = (0.08 * rng.standard_normal(size)).astype(np.float32)
    for _ in range(10):  # the user speaks: AEC3 alone lets half of it through, the other path all of it
        out = mix.frame(mic + voice, 0.5 * voice, voice)
    assert np.array_equal(out, voice)
    for _ in range(mix.hold + 10):  # the user stopped: back to AEC3 alone after the hold
        out = mix.frame(mic, quiet, leaky)
    assert np.array_equal(out, quiet)


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise tilted to the low frequencies like a voice, in syllables with pauses between (2.5 a second)."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    x = lfilter([1.0], [1.0, -0.9], rng.standard_normal(n))
    env = np.maximum(0.0, np.sin(2 * np.pi * 2.5 * np.arange(n) / RATE))
    return (0.05 * x * env).astype(np.float32)


def test_the_kalman_pre_canceller_converges_within_a_second_of_finding_the_delay() -> None:
    """On coloured, pausing input a normalised LMS at a fixed step (the filter before) had removed 18 dB
    after 3 s and 36 dB after 6 s of this echo; the Kalman filter removes over 25 dB after 3 s (the delay
    is found after about 1 s) and over 45 dB after 6 s."""
    from kame.audio.echo_linear import LinearEchoCanceller

    frame = RATE // 100
    lin = LinearEchoCanceller(RATE, frame)
    assert lin.expected_erle_db == 0.0  # no delay known, nothing expected
    delay, tail = int(0.2 * RATE), int(0.2 * RATE)
    ir = np.zeros(delay + tail)
    ir[delay] = 0.5
    ir[delay + 1 :] = 0.1 * np.random.default_rng(3).standard_normal(tail - 1) * np.exp(-np.arange(tail - 1) / (0.05 * RATE))
    far = speech_like(6)
    echo = np.convolve(far, ir)[: far.size].astype(np.float32)
    out = np.concatenate([lin.process(far[i : i + frame], echo[i : i + frame]) for i in range(0, far.size, frame)])

    def erle(a: float, b: float) -> float:
        w = slice(int(a * RATE), int(b * RATE))
        return float(10 * np.log10(np.mean(echo[w] ** 2) / np.mean(out[w] ** 2)))

    assert lin.delay is not None and abs(lin.delay - delay) <= lin.margin
    assert erle(2.5, 3.0) >= 25
    assert erle(5.5, 6.0) >= 45
    assert lin.expected_erle_db >= 10  # its own estimate from the Kalman state (conservative: the process noise)


def test_the_kalman_prior_follows_a_decaying_room_and_the_measured_echo_level() -> None:
    """The initial state variance: the measured echo return loss (times the prior's scale) spread over the
    partitions with the 60 dB decay of the prior's RT60, the same in every bin."""
    from kame.audio.echo_linear import LinearEchoCanceller

    frame = RATE // 100
    lin = LinearEchoCanceller(RATE, frame)
    far = modulated_noise(1.2)
    for i in range(0, far.size, frame):  # the microphone hears the reference 12 dB down (a quarter of its power)
        lin.delays.push(far[i : i + frame], 0.25 * far[i : i + frame])
    prior = lin._prior()
    s = lin.settings
    assert prior.shape == (lin.partitions, lin.bins)
    assert np.allclose(prior, prior[:, :1])
    assert abs(float(prior[:, 0].sum()) / (s.prior_scale * 0.0625) - 1) < 0.1
    per_partition_db = 10 * np.log10(prior[0, 0] / prior[1, 0])
    assert abs(per_partition_db - 60 * frame / RATE / s.prior_rt60_s) < 1e-6


def test_while_the_user_speaks_the_pre_cancellers_output_is_blended_in_once_it_has_converged() -> None:
    """The floor under the suppressor: with the user speaking, a quarter of the pre-canceller's own output
    (-12 dB) goes out with the other three quarters from AEC3-after-it, but only once the pre-canceller expects to remove
    6 dB or more; where only the assistant speaks none of it does."""
    from kame.audio.echo import _Mix

    size = RATE // 100
    rng = np.random.default_rng(1)
    mic = (0.1 * rng.standard_normal(size)).astype(np.float32)
    quiet = (1e-4 * rng.standard_normal(size)).astype(np.float32)
    lin_residual = (0.01 * rng.standard_normal(size)).astype(np.float32)
    voice = (0.08 * rng.standard_normal(size)).astype(np.float32)
    suppressed = (0.1 * voice).astype(np.float32)  # AEC3 after the pre-canceller takes 20 dB of the voice

    def talk(mix: _Mix, erle_db: float) -> np.ndarray:
        for _ in range(50):  # the assistant alone: nothing of the linear output goes out
            out = mix.frame(mic, quiet, quiet, lin_residual, erle_db)
        assert np.array_equal(out, quiet)
        for _ in range(10):  # the user speaks; AEC3 on the microphone lets half through
            out = mix.frame(mic + voice, 0.5 * voice, suppressed, voice + lin_residual, erle_db)
        return out

    out = talk(_Mix(), 3.0)  # not converged: its output is mostly echo, none of it
    assert np.array_equal(out, suppressed)
    mix = _Mix()
    out = talk(mix, 12.0)
    a = mix.voice_floor
    assert abs(a - 0.251) < 1e-3  # -12 dB
    assert np.allclose(out, (1 - a) * suppressed + a * (voice + lin_residual), atol=1e-6)
    for _ in range(mix.hold + 10):  # the user stopped: back to AEC3 alone, no linear output
        out = mix.frame(mic, quiet, quiet, lin_residual, 12.0)
    assert np.array_equal(out, quiet)
