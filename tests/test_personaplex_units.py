"""PersonaPlex's pure pieces: voice names, the catalog's choices, the role's tags, the prompt plan's frames."""

from __future__ import annotations

from pathlib import Path

import pytest

from kame.errors import CheckpointError
from kame.frontend.personaplex import PersonaPlexSpec, is_personaplex, wrap_system_tags
from kame.frontend.prompts import build_plan
from kame.frontend.voices import UnknownVoice, VoiceCatalog, voice_stem


def test_voice_stem() -> None:
    assert voice_stem("NATF2") == voice_stem("NATF2.pt") == voice_stem(" NATF2.wav ") == "NATF2"
    for bad in ("../x", "a/b.pt", "a\\b", ".hidden", "", ".pt"):
        assert voice_stem(bad) is None, bad


def test_catalog_default_resolve_and_choose(tmp_path: Path) -> None:
    for name in ("VARF0.pt", "NATF2.pt", "MINE.wav", "MINE.pt", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    catalog = VoiceCatalog(tmp_path)
    assert catalog.names == ["MINE", "NATF2", "VARF0"] and catalog.default == "NATF2"
    assert catalog.resolve(None) == "NATF2" and catalog.resolve("VARF0.pt") == "VARF0"
    with pytest.raises(UnknownVoice, match="'nope': this checkpoint's voices are MINE, NATF2, VARF0"):
        catalog.resolve("nope")
    assert catalog.choose("VARF0") == ("VARF0", None)
    chosen, notice = catalog.choose("nope.pt")
    assert chosen == "NATF2" and notice is not None and notice.endswith("using 'NATF2'")
    (tmp_path / "NATF2.pt").unlink()
    assert VoiceCatalog(tmp_path).default == "MINE"  # no NATF2: the first by name
    assert VoiceCatalog(tmp_path, "VARF0").default == "VARF0"
    with pytest.raises(CheckpointError, match="frontend.voice 'X'"):
        VoiceCatalog(tmp_path, "X")


def test_role_tags_and_detection() -> None:
    assert wrap_system_tags("  Be kind. ") == "<system> Be kind. <system>"
    assert wrap_system_tags("<system> Be kind. <system>") == "<system> Be kind. <system>"
    assert is_personaplex({"model_type": "personaplex"}, False) and is_personaplex(None, True)
    assert not is_personaplex({"model_type": "moshi"}, False)


def test_spec_tokens_must_fit_the_card() -> None:
    assert PersonaPlexSpec.from_config(None, 2048).silence_tokens[0] == 948  # the released Mimi's codes
    with pytest.raises(CheckpointError, match="do not fit the LM's audio card 64"):
        PersonaPlexSpec.from_config({}, 64)
    spec = PersonaPlexSpec.from_config({"personaplex": {"silence_tokens": [1] * 8, "sine_tokens": [2] * 8}}, 64)
    assert spec.silence_tokens == (1,) * 8 and spec.sine_tokens == (2,) * 8
    with pytest.raises(CheckpointError, match="expected 8 integers"):
        PersonaPlexSpec.from_config({"personaplex": {"silence_tokens": [1, 2]}}, 64)


def test_plan_frames() -> None:
    spec = PersonaPlexSpec(silence_tokens=(5,) * 8, sine_tokens=(6,) * 8, silence_frames=2)
    plan = build_plan(spec, 3, [40, 41], wav_codes=[[7] * 8, [8] * 8], voice_name="MINE")
    assert plan.voice == "MINE" and plan.voice_frames == 2 and plan.first_forced == 0 and plan.total == 8
    assert [plan.forced_frame(j) for j in range(8)] == [
        (3, (7,) * 8), (3, (8,) * 8), (3, (5,) * 8), (3, (5,) * 8), (40, (5,) * 8), (41, (5,) * 8),
        (3, (5,) * 8), (3, (5,) * 8),
    ]
    assert plan.forced_frame(8) is None and plan.forced_frame(-1) is None
    bare = build_plan(spec, 3, [])
    assert bare.total == 4 and bare.voice is None
