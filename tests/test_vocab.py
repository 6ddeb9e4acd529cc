"""The text vocabulary, as built from a loaded checkpoint (a tiny one written with moshi's own classes)."""

from __future__ import annotations

from pathlib import Path

import torch

from kame.vocab import MOSHI_VOCAB, WORD_START, TextVocab


def test_vocab_from_the_loaded_model_and_tokenizer(tiny_kame_ckpt: Path) -> None:
    from kame.frontend.config import FrontendConfig
    from kame.frontend.models import load_frontend

    models = load_frontend(FrontendConfig(checkpoint=str(tiny_kame_ckpt)), torch.device("cpu"))
    vocab = models.vocab
    assert vocab.pad_id == models.lm.text_padding_token_id and vocab.end_of_padding_id == models.lm.end_of_text_padding_id
    assert vocab == MOSHI_VOCAB  # the tiny checkpoint keeps Moshi's ids
    first = models.tokenizer.encode("hello there")
    pieces = [models.tokenizer.id_to_piece(i) for i in first]
    assert vocab.starts_word(pieces[0]) and "".join(vocab.piece_text(p) for p in pieces).strip() == "hello there"


def test_silent_ids_and_pieces() -> None:
    vocab = TextVocab(pad_id=7, end_of_padding_id=5)
    assert vocab.silent_ids == {5, 7}
    assert [vocab.is_text(i) for i in (None, -2, -1, 5, 7, 0, 3, 42)] == [False] * 5 + [True] * 3
    assert vocab.piece_text(WORD_START + "Hel") == " Hel" and not vocab.starts_word("lo")
