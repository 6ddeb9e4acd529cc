"""kame.audio.pcm, the one PCM16 / G.711 <-> float32 conversion: scale, clipping, rounding, odd bytes, G.711."""

from __future__ import annotations

import numpy as np

from kame.audio import pcm
from kame.audio.pcm import float_to_g711, float_to_pcm16, float_to_pcm16_bytes, g711_to_float, pcm16_to_float


def test_full_scale_clips_and_rounds_without_wrapping() -> None:
    ints = float_to_pcm16(np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 1.5 / 32767], np.float32))
    assert ints.dtype == np.dtype("<i2")
    assert ints.tolist() == [-32767, -32767, -16384, 0, 16384, 32767, 32767, 2]  # 16383.5 and 1.5 round to even


def test_bytes_round_trip_within_one_step_and_keep_their_shape() -> None:
    rng = np.random.default_rng(0)
    pcm = rng.uniform(-1, 1, 2400).astype(np.float32)
    back = pcm16_to_float(float_to_pcm16_bytes(pcm))
    assert back.dtype == np.float32 and back.shape == pcm.shape
    assert np.max(np.abs(back - pcm)) < 2 / 32768
    stereo = np.stack([pcm, -pcm], axis=1)
    interleaved = pcm16_to_float(float_to_pcm16_bytes(stereo)).reshape(-1, 2)
    assert np.allclose(interleaved[:, 1], -interleaved[:, 0], atol=1 / 32768)


def test_an_odd_trailing_byte_is_ignored() -> None:
    data = float_to_pcm16_bytes(np.array([0.25, -0.25], np.float32)) + b"\x7f"
    assert pcm16_to_float(data).tolist() == [8192 / 32768, -8192 / 32768]


def test_g711_both_laws_round_trip_a_tone_closely() -> None:
    t = np.arange(800) / 8000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    for law in ("ulaw", "alaw"):
        coded = float_to_g711(tone, law)
        assert len(coded) == tone.size  # one byte a sample
        back = g711_to_float(coded, law)
        snr = 10 * np.log10(np.sum(tone**2) / np.sum((back - tone) ** 2))
        assert snr > 30, (law, snr)  # G.711 keeps ~38 dB on a loud tone
    assert float_to_g711(tone, "ulaw") != float_to_g711(tone, "alaw")


def test_audioop_module_is_importable_on_this_python() -> None:
    # stdlib up to 3.12; the audioop-lts dependency provides it from 3.13 (pyproject marker); moved here
    # from test_live_units with the G.711 conversion itself
    assert hasattr(pcm.audioop, "lin2ulaw") and hasattr(pcm.audioop, "alaw2lin")


def test_the_reader_joins_a_sample_split_across_appends_in_every_encoding() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.9, 0.9, 301).astype(np.float32)
    for encoding in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        data = pcm.to_encoding(x, encoding)
        assert len(data) == x.size * (2 if encoding == "audio/pcm" else 1)
        whole = pcm.EncodedAudioReader(encoding).read(data)
        reader = pcm.EncodedAudioReader(encoding)
        pieces = [reader.read(data[i:i + 7]) for i in range(0, len(data), 7)]  # odd cuts split samples
        assert np.array_equal(np.concatenate(pieces), whole)
        assert whole.size == x.size and np.max(np.abs(whole - x)) < (2e-4 if encoding == "audio/pcm" else 0.06)


def test_stream_resampler_is_continuous_and_none_between_equal_rates() -> None:
    assert pcm.stream_resampler(24000, 24000) is None
    t = np.arange(24000) / 24000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    for rate in (16000, 8000):
        whole = pcm.StreamResampler(24000, rate)
        one = np.concatenate([whole.push(tone), whole.flush()])
        cut = pcm.stream_resampler(24000, rate)
        assert cut is not None
        parts = np.concatenate([cut.push(tone[i:i + 1000]) for i in range(0, tone.size, 1000)] + [cut.flush()])
        assert abs(one.size - rate) <= 2 and np.allclose(parts, one, atol=1e-5)
