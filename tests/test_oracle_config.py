"""Oracle config: defaults match the published loop, strict keys, documented fields."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kame.oracle.config import OracleConfig, SanitizerConfig
from kame.oracle.sanitize import SanitizeOptions, sanitize
from kame.oracle.word_tokenizer import WordStreamTokenizer


def test_defaults() -> None:
    cfg = OracleConfig()
    assert cfg.policy == "reset" and cfg.barge_in == "keep"
    assert (cfg.min_new_words, cfg.max_restarts, cfg.restart_window_s) == (2, 5, 2.0)
    assert cfg.max_answer_words == 30 and cfg.oracle_delay_s == 0.0
    assert cfg.sanitize.options() == SanitizeOptions()


def _all_fields(model: type[BaseModel]):  # type: ignore[no-untyped-def]
    for name, field in model.model_fields.items():
        yield model, name, field
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _all_fields(ann)


def test_every_field_is_described_and_extra_is_forbidden() -> None:
    for model, name, field in _all_fields(OracleConfig):
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            assert field.description, f"{model.__name__}.{name} has no description"
    with pytest.raises(ValidationError):
        OracleConfig(polciy="reset")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        OracleConfig(sanitize={"case": "upper"})
    with pytest.raises(ValidationError):
        OracleConfig(policy="sometimes")  # type: ignore[arg-type]


def test_sanitizer_options_flow_into_the_tokenizer() -> None:
    cfg = OracleConfig(sanitize=SanitizerConfig(case="lower", keep_question=True), max_fed_words=2)
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    tok = WordStreamTokenizer.from_config(encode, cfg)
    ids = tok.feed("Is it? Yes it is.") + tok.flush()
    assert ids == encode(sanitize("Is it?", SanitizeOptions(case="lower", keep_question=True)))
    assert tok.text == "is it?" and tok.done
