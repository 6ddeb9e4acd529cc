"""A commentary's limits on the Live wire. No I/O.

In client delegation the application's ``session.commentary.append`` is the
oracle's only source: the session's answer source makes each one a new oracle
answer (:func:`kame.session.answers.commentary_answer`); this module holds the
contract's limit on one append, checked before the session sees it.
"""

from __future__ import annotations

from kame.server.wires.live.events import LiveError

#: The contract's limit on one append's content.
MAX_APPEND_TOKENS = 500


def estimated_tokens(text: str) -> int:
    """The contract's tokens, estimated as GPT-Live clients estimate them before they split a long append:
    about four ASCII characters a token, a whole token for any other character.

    The limit is OpenAI's tokenizer's, not Moshi's: SentencePiece with a 32k vocabulary cuts English into
    more pieces, so counting Moshi's tokens would refuse appends the contract allows (Pipecat splits
    answers into 450-token pieces by this same estimate, and treats any ``error`` as a failure)."""
    quarters = sum(1 if ch.isascii() else 4 for ch in text)
    return (quarters + 3) // 4


def check_length(content: str, kind: str, event_id: str | None) -> None:
    """The contract's limit on one append: 500 tokens (:func:`estimated_tokens`)."""
    if estimated_tokens(content) > MAX_APPEND_TOKENS:
        raise LiveError("content_too_long", f"session.{kind}.append: content is limited to {MAX_APPEND_TOKENS} tokens",
                        param="content", client_event_id=event_id)
