"""PersonaPlex checkpoints: the released layout loads, and sessions are step-identical to PersonaPlex's algorithm.

The reference (tests/support/personaplex_ref.py) restates NVIDIA's
``step_system_prompts`` and server loop on moshi's own ``LMGen`` for one
session, written apart from the engine (NVIDIA's code cannot be vendored);
the tiny checkpoint's voices come from its restatement of the
embedding-saving path.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from kame.audio.files import read_audio, write_wav
from kame.audio.pcm import float_to_pcm16
from kame.cli import main as kame_main
from kame.frontend.config import FrontendConfig
from kame.frontend.engine import EngineCore, SlotOutput
from kame.frontend.models import FrontendModels, load_frontend
from kame.frontend.voices import UnknownVoice
from tests.support.personaplex_ref import PersonaPlexReference, RefFrame

ROLE = "Be kind."
FRAMES = 6


@pytest.fixture(scope="module")
def pp_ckpt(tiny_personaplex_ckpt: Path) -> Path:
    return tiny_personaplex_ckpt


def _user(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.2 * rng.standard_normal(1920 * FRAMES)).astype(np.float32)


def _models(ckpt: Path, batch: int, greedy: bool) -> tuple[FrontendModels, FrontendConfig]:
    cfg = FrontendConfig(checkpoint=str(ckpt), dtype="float32", batch_size=batch)
    cfg.sampling.use_sampling = not greedy
    return load_frontend(cfg, torch.device("cpu")), cfg


def _assert_same(ref: list[RefFrame], got: list[SlotOutput], pcm_atol: float = 0.0) -> None:
    """Same tokens, same PCM (a batch of 2 decodes through other float kernels: within ``pcm_atol``)."""
    assert len(ref) == len(got) == FRAMES
    for i, (a, b) in enumerate(zip(ref, got)):
        assert (a.text, a.codes) == (b.text_id, b.audio_codes), f"frame {i}"
        np.testing.assert_allclose(a.pcm, b.pcm, rtol=0, atol=pcm_atol, err_msg=f"frame {i}")


def test_layout_loads_with_dep_q_16_and_voices(pp_ckpt: Path) -> None:
    models, _ = _models(pp_ckpt, 1, greedy=True)
    assert models.files.personaplex and models.depformer_steps == 16
    assert len(models.lm.linears) == 16 and models.lm.dep_q == 8  # 16 loaded, 8 generated for LMGen
    assert models.mimi.num_codebooks == 8
    assert models.voice_names() == ["NATF2", "VARM1"] and models.voices is not None
    assert models.voices.default == "NATF2"
    with pytest.raises(UnknownVoice, match="NATF2, VARM1"):
        models.prompt_plan("NOPE", None)
    plan = models.prompt_plan("VARM1.pt", ROLE)
    assert plan is not None and plan.voice == "VARM1"
    role = models.tokenizer.encode(f"<system> {ROLE} <system>")
    assert plan.total == plan.voice_frames + 12 + len(role)
    empty = models.prompt_plan(None, "   ")  # PersonaPlex fails on an empty role; here it has no text frames
    assert empty is not None and empty.voice == "NATF2" and empty.total == empty.voice_frames + 12


def test_kame_run_seeded_matches_personaplex_step_for_step(pp_ckpt: Path, tmp_path: Path) -> None:
    """``kame run --checkpoint DIR --voice NAME --persona TEXT --seed N --text-out F --fast``: every text token
    and the reply audio equal the reference's, sampled with the seed (batch of 1, as ``kame run`` steps)."""
    wav_in, wav_out, text_out = tmp_path / "in.wav", tmp_path / "out.wav", tmp_path / "text.jsonl"
    write_wav(wav_in, _user(1))
    user = read_audio(wav_in)
    ref = PersonaPlexReference(pp_ckpt, use_sampling=True).session(pp_ckpt / "voices" / "VARM1.pt", ROLE, 42, user)
    rc = kame_main(["run", "--checkpoint", str(pp_ckpt), "--voice", "VARM1", "--persona", ROLE, "--seed", "42",
                    "--device", "cpu", "--input", str(wav_in), "--output", str(wav_out), "--text-out", str(text_out),
                    "--fast"])
    assert rc == 0
    rows = [json.loads(line) for line in text_out.read_text().splitlines()]
    assert [(r["step"], r["id"]) for r in rows] == [(i, f.text) for i, f in enumerate(ref)]
    expected = float_to_pcm16(np.concatenate([f.pcm for f in ref]))
    with wave.open(str(wav_out)) as w:
        got = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    np.testing.assert_array_equal(got, expected)
    assert kame_main(["run", "--checkpoint", str(pp_ckpt), "--voice", "NOPE", "--device", "cpu", "--input",
                      str(wav_in), "--output", str(wav_out), "--fast"]) != 0


def test_greedy_batched_slot_matches_while_another_slot_prompts_and_talks(pp_ckpt: Path) -> None:
    """Slot 1 (NATF2) against the reference; slot 0 runs another voice and role in the same ticks, starting
    earlier, so slot 1's prompt steps share ticks with slot 0's conversation."""
    user = _user(2)
    ref = PersonaPlexReference(pp_ckpt, use_sampling=False).session(pp_ckpt / "voices" / "NATF2.pt", ROLE, None, user)
    models, cfg = _models(pp_ckpt, 2, greedy=True)
    core = EngineCore(models, cfg)
    other = _user(3)
    core.attach(0, models.prompt_plan("VARM1", "Talk."))
    while core.prompting(0):
        core.prompt_tick()
    core.attach(1, models.prompt_plan("NATF2", ROLE))
    got: list[SlotOutput] = []
    tick = 0
    while len(got) < FRAMES:
        frame0 = other[(tick % FRAMES) * 1920:((tick % FRAMES) + 1) * 1920]
        frames: dict[int, np.ndarray | None] = {0: frame0}
        prompting = core.prompting(1)
        frames[1] = np.zeros(1920, np.float32) if prompting else user[len(got) * 1920:(len(got) + 1) * 1920]
        out = core.tick(frames)
        assert not out[0].prompting
        if prompting:
            assert out[1].prompting and not out[1].pcm.any()
        else:
            got.append(out[1])
        tick += 1
    _assert_same(ref, got, pcm_atol=1e-6)


@pytest.mark.alone  # ticks against the wall clock: another worker's load would blur them (failed at load 5-11)
def test_engine_thread_prompts_beside_real_time_slot(pp_ckpt: Path) -> None:
    """A slot's prompts step in every tick of a slot talking in real time and, between its frames, in
    prompt-only ticks: more prompt steps than frames went by (faster than real time), and the talking
    slot's frames wait at most one extra tick."""
    import threading
    import time

    from kame.frontend.engine_thread import EngineThread, PromptRequest, TickStats

    models, cfg = _models(pp_ckpt, 2, greedy=True)
    core = EngineCore(models, cfg)
    ticks: list[tuple[float, TickStats]] = []  # when each tick ended (after it delivered its frames)
    engine = EngineThread(core, max_batch_wait_s=0.0, on_tick=lambda s: ticks.append((time.monotonic(), s)))
    got: dict[int, list[tuple[float, SlotOutput]]] = {0: [], 1: []}
    ready: dict[int, threading.Event] = {0: threading.Event(), 1: threading.Event()}

    def sink(slot: int):  # type: ignore[no-untyped-def]
        return lambda out: got[slot].append((time.monotonic(), out))

    plan = models.prompt_plan("NATF2", ROLE)
    assert plan is not None
    engine.start()
    try:
        s0 = engine.attach(sink(0), lambda m: None, lambda s: ready[0].set(), prompt=PromptRequest("VARM1", "Talk."))
        assert ready[0].wait(10)
        deadline = time.monotonic() + 20
        while core.prompting(s0) and time.monotonic() < deadline:  # nothing fed: prompt-only ticks
            time.sleep(0.01)
        assert not core.prompting(s0) and engine.prompt_ticks > 0
        s1 = engine.attach(sink(1), lambda m: None, lambda s: ready[1].set(), prompt=PromptRequest("NATF2", ROLE))
        assert ready[1].wait(10)
        alone_before = engine.prompt_ticks
        talked_before = len(got[0])
        fed: list[float] = []
        frame = _user(4)[:1920]
        start = time.monotonic()
        while core.prompting(s1) and len(fed) < 3 * plan.total:  # slot 0 in real time meanwhile
            time.sleep(max(0.0, start + len(fed) * 0.08 - time.monotonic()))
            fed.append(time.monotonic())
            engine.feed(s0, frame)
        prompt_frames = len(fed)
        alone = engine.prompt_ticks - alone_before
        talked = len(got[0]) - talked_before  # slot 0's frames stepped while slot 1 was in its prompts
        for _ in range(3):  # a few frames after the prompt
            time.sleep(max(0.0, start + len(fed) * 0.08 - time.monotonic()))
            fed.append(time.monotonic())
            engine.feed(s0, frame)
        time.sleep(0.5)
    finally:
        engine.stop()
    assert not core.prompting(s1), f"slot 1 still in its prompts after {prompt_frames} frames"
    # faster than real time: fewer of slot 0's frames went by than slot 1 took prompt steps
    assert alone >= 1 and talked < plan.total - 1, (alone, talked, prompt_frames, plan.total)
    assert got[1] == []  # nothing fed on slot 1: its prompt steps deliver nothing
    outs = got[0][-len(fed):]
    assert len(outs) == len(fed) and not any(o.prompting for _, o in outs)
    # counted in ticks, not seconds (a loaded machine stretches every tick alike): between a frame's arrival
    # and its output at most one tick ended, the one already running when it arrived
    for (t_out, _), t_in in zip(outs, fed):
        ended = [t for t, _ in ticks if t_in < t < t_out]
        assert len(ended) <= 1, (len(ended), round(t_out - t_in, 3))


def test_voices_tgz_is_unpacked_once(pp_ckpt: Path, tmp_path: Path) -> None:
    """The released files ship the voices as voices.tgz (a voices/ folder inside), unpacked next to it."""
    import shutil
    import tarfile

    from kame.frontend.checkpoint import resolve_checkpoint
    from kame.frontend.voices import VoiceCatalog, unpack_voices

    copy = tmp_path / "ckpt"
    shutil.copytree(pp_ckpt, copy, ignore=shutil.ignore_patterns("voices"))
    with tarfile.open(copy / "voices.tgz", "w:gz") as tar:
        tar.add(pp_ckpt / "voices", arcname="voices")
    files = resolve_checkpoint(str(copy))
    assert files.personaplex and files.voices == copy / "voices.tgz"
    folder = unpack_voices(files.voices, tmp_path / "cache")
    assert folder == copy / "voices" and VoiceCatalog(folder).names == ["NATF2", "VARM1"]
    assert (folder / "NATF2.pt").read_bytes() == (pp_ckpt / "voices" / "NATF2.pt").read_bytes()


def test_wav_voice_added_by_the_operator_matches_personaplex(pp_ckpt: Path, tmp_path: Path) -> None:
    """A wav in the voices folder: its Mimi codes forced frame by frame (PersonaPlex's wav path), greedy."""
    import shutil

    from tests.support.personaplex_tiny import voice_pcm

    copy = tmp_path / "ckpt"
    shutil.copytree(pp_ckpt, copy)
    write_wav(copy / "voices" / "MINE.wav", voice_pcm(5, seconds=0.3))
    user = _user(6)
    ref = PersonaPlexReference(copy, use_sampling=False).session(copy / "voices" / "MINE.wav", ROLE, None, user)
    models, cfg = _models(copy, 1, greedy=True)
    assert models.voice_names() == ["MINE", "NATF2", "VARM1"]
    core = EngineCore(models, cfg)
    plan = models.prompt_plan("MINE", ROLE)
    assert plan is not None and plan.embeddings is None and plan.voice_frames == 4
    core.attach(0, plan)
    while core.prompting(0):
        core.prompt_tick()
    _assert_same(ref, [core.tick({0: user[i * 1920:(i + 1) * 1920]})[0] for i in range(FRAMES)])


DOWNLOAD = """
import sys
from pathlib import Path
from kame.cli import main
rc = main(["download", "--checkpoint", "nvidia/personaplex-7b-v1", "--asr", "none"])
print("rc", rc)
import os
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from kame.frontend.config import FrontendConfig
from kame.frontend.models import load_frontend
models = load_frontend(FrontendConfig(checkpoint="nvidia/personaplex-7b-v1"), torch.device("cpu"),
                       cache_dir=sys.argv[1])
print("voices", ",".join(models.voice_names()), "dep", models.depformer_steps)
"""


def test_kame_download_fetches_the_voices(pp_ckpt: Path, tmp_path: Path) -> None:
    """``kame download --checkpoint nvidia/personaplex-7b-v1`` against a stand-in Hub serving PersonaPlex's
    released file names and voices.tgz: the voices come too, and load offline afterwards."""
    import hashlib
    import os
    import subprocess
    import sys
    import tarfile
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    served = tmp_path / "repo"
    served.mkdir()
    for f in pp_ckpt.iterdir():
        if f.is_file():
            (served / f.name).write_bytes(f.read_bytes())
    with tarfile.open(served / "voices.tgz", "w:gz") as tar:
        tar.add(pp_ckpt / "voices", arcname="voices")
    commit = "a" * 40
    asked: list[str] = []

    class Hub(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            asked.append(self.path)
            prefix = f"/nvidia/personaplex-7b-v1/resolve/{commit}/"
            name = self.path.split("/resolve/", 1)[-1].split("/", 1)[-1]
            path = served / name
            if not self.path.startswith("/nvidia/personaplex-7b-v1/resolve/") or not path.is_file():
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Location", prefix + name)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(True)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_TOKEN", None)
    try:
        res = subprocess.run([sys.executable, "-c", DOWNLOAD, str(tmp_path / "kame")], capture_output=True,
                             text=True, env=env, timeout=120)
    finally:
        server.shutdown()
    assert "rc 0" in res.stdout, res.stdout + res.stderr[-3000:]
    assert "front-end voices:" in res.stdout and "voices.tgz" in res.stdout
    assert "voices NATF2,VARM1 dep 16" in res.stdout, res.stdout + res.stderr[-3000:]
    assert any(p.endswith("/voices.tgz") for p in asked)
