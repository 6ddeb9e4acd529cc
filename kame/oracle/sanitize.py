"""LLM answer -> spoken-style text for the oracle stream.

KAME's oracle stream was trained on predictions with no symbols except ``.``
and ``,``, so markdown, lists, code and unpronounced symbols are removed here
(the prompt asks for the same, this is the safety net).

The text is processed whitespace-token by whitespace-token, left to right,
and a token's output depends only on itself and on what came *before* it.
The one exception is punctuation that attaches to the previous word: a
stand-alone mark (``Paris — the`` -> ``Paris, the``) or a line break
(``apples\\n- pears`` -> ``apples, pears``). So:

* :func:`sanitize` of a prefix that ends at a word boundary is a prefix of
  :func:`sanitize` of the whole text, except that the last word may still get
  one mark attached (see :func:`sanitize` for the exact statement).
* :func:`settled_words` returns the words of a *growing* text that nothing
  appended later can change: every word except the last complete one, which
  is held until a token that cannot attach punctuation to it begins. With
  LLM chunks like ``" word"`` that happens in the chunk that completes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from kame.oracle.numbers import spell_number

#: Characters of a stand-alone token that attaches punctuation to the previous word.
ATTACHABLE = frozenset(".,!?;:…-–—")
_SENTENCE_END = frozenset(".!?…")
_CLAUSE = frozenset(",;:-–—")

_TOKEN = re.compile(r"\S+")
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)?")
_TAG = re.compile(r"<[^<>\s]*>")
_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|www\.)", re.IGNORECASE)
_CURRENCY = {"$": "dollars", "€": "euros", "£": "pounds"}
_CURRENCY_AMOUNT = re.compile(r"([$€£])(\d[\d.,]*\d|\d)")
_SYMBOL_WORDS = {"%": "percent", "&": "and", "+": "plus", "=": "equals", "@": "at", "°": "degrees"}
_NEGATIVE = re.compile(r"(?<![^\W_])-(?=\d)")
_DASH_RUN = re.compile(r"-{2,}|[—–]")
_CLOCK = re.compile(r"(?<=\d):(?=\d)")
_KEPT = re.compile(r"[^\w\s'.,?!;:]|_")
#: A spoken word: letters/digits, with inner apostrophes and dots (don't, 3.14,
#: e.g) and commas between digits (1,000).
_WORD = re.compile(r"[^\W_]+(?:(?:['.]|(?<=\d),(?=\d))[^\W_]+)*")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_BULLETS = frozenset({"-", "*", "+", "•", "·", "‣", "▪", "–", "—"})
_NUMBERED = re.compile(r"^(\d{1,2})[.)]$")

LineKind = Literal["plain", "heading", "list"]


@dataclass(frozen=True)
class SanitizeOptions:
    """Text normalisation choices; they change the oracle tokens, so they are measured."""

    keep_question: bool = False  #: keep ``?`` (training data had only ``.`` and ``,``)
    keep_exclamation: bool = False  #: keep ``!``
    case: Literal["keep", "lower"] = "keep"
    numbers: Literal["keep", "spell"] = "keep"  #: "spell" writes 42 as "forty two"
    spell_symbols: bool = True  #: %, &, +, =, @, °, $/€/£ amounts -> words; else dropped


DEFAULT_OPTIONS = SanitizeOptions()


def sanitize(text: str, options: SanitizeOptions | None = None) -> str:
    """Spoken-style version of a complete answer ``text``.

    Words are joined by single spaces; punctuation is ``.`` and ``,`` only
    (plus ``?``/``!`` if kept), attached to the word before it.

    Stability: let ``P = text[:i]`` where ``text[i]`` is whitespace and
    ``sanitize(P)`` is not empty. Then ``sanitize(text) == sanitize(P) + R``
    where ``R`` is empty, starts with a space, or is one punctuation mark
    attached to P's last word followed by a space or the end.
    """
    return " ".join(spoken_words(text, options))


def spoken_words(text: str, options: SanitizeOptions | None = None) -> list[str]:
    """The words of :func:`sanitize` (each with its attached punctuation)."""
    return _analyse(text, options or DEFAULT_OPTIONS, final=True)[0]


def settled_words(text: str, options: SanitizeOptions | None = None) -> list[str]:
    """The words of the growing ``text`` that no continuation can change.

    For every extension ``T`` of ``text``, ``settled_words(text)`` is a prefix
    of ``settled_words(T)`` and of ``spoken_words(T)``. A word at the end of
    the text is not settled (it may be incomplete), nor is the last complete
    one while only whitespace or stand-alone punctuation follows it.
    """
    words, settled = _analyse(text, options or DEFAULT_OPTIONS, final=False)
    return words[:settled]


def _analyse(text: str, opts: SanitizeOptions, final: bool) -> tuple[list[str], int]:
    """Core pass. Returns (words, how many are settled); all are settled if ``final``.

    ``final`` treats the last token as complete (end of answer); otherwise a
    token not followed by whitespace is only inspected for whether it closes
    the previous word.
    """
    words: list[str] = []
    attach_open = False  # punctuation may still attach to words[-1]
    line_kind: LineKind = "plain"
    in_fence = False
    pos = 0
    for index, match in enumerate(_TOKEN.finditer(text)):
        sep = text[pos : match.start()]
        pos = match.end()
        token = match.group()
        line_start = index == 0 or "\n" in sep
        prev_kind = line_kind
        if line_start and index > 0:
            if attach_open and not in_fence:
                _attach(words, _line_end_mark(sep, line_kind), opts)
            attach_open = False  # a token at line start never attaches
            line_kind = "plain"
        if not final and pos == len(text):
            # Incomplete last token: it closes the previous word unless it
            # might still become stand-alone punctuation.
            if line_start or in_fence or not set(token) <= ATTACHABLE:
                attach_open = False
            break
        if in_fence:
            if token.startswith("```"):
                in_fence = False
            continue
        if token.startswith("```") and not _is_inline_code(token):
            in_fence = True
            attach_open = False
            continue
        if line_start:
            kind = _line_marker(token, prev_kind if index > 0 else "plain")
            if kind is not None:
                line_kind = kind
                continue
        elif set(token) <= ATTACHABLE:
            if attach_open:
                _attach(words, _mark_of(token), opts)
            continue
        new = _clean_token(token, opts)
        attach_open = bool(new)
        words.extend(new)
    if final:
        return words, len(words)
    return words, len(words) - (1 if attach_open else 0)


def _is_inline_code(token: str) -> bool:
    return len(token) > 6 and token.endswith("```")


def _line_marker(token: str, prev_kind: LineKind) -> LineKind | None:
    """Kind of a markdown line-start marker token (``#``, ``-``, ``1.``, ``>``), else None.

    A number is a list marker only if it is ``1.`` or continues a list, so
    that an answer like ``"7. That is all."`` keeps its number.
    """
    if set(token) == {"#"}:
        return "heading"
    if token in _BULLETS:
        return "list"
    numbered = _NUMBERED.match(token)
    if numbered and (numbered.group(1) == "1" or prev_kind == "list"):
        return "list"
    if not any(ch.isalnum() for ch in token):
        return "plain"  # quote markers, rules (---, ***), table pipes...
    return None


def _line_end_mark(sep: str, line_kind: LineKind) -> str:
    """Punctuation a line break gives the word before it."""
    if sep.count("\n") >= 2 or line_kind != "list":
        return "."
    return ","


def _mark_of(chars: str) -> str:
    """``.``, ``,``, ``?``, ``!`` or "" for a run of punctuation characters (before options)."""
    if "?" in chars:
        return "?"
    if "!" in chars:
        return "!"
    if any(ch in _SENTENCE_END for ch in chars):
        return "."
    if any(ch in _CLAUSE for ch in chars):
        return ","
    return ""


def _apply_mark_options(mark: str, opts: SanitizeOptions) -> str:
    if mark == "?" and not opts.keep_question:
        return "."
    if mark == "!" and not opts.keep_exclamation:
        return "."
    return mark


def _attach(words: list[str], mark: str, opts: SanitizeOptions) -> None:
    """Give the last word ``mark`` unless it already ends with punctuation."""
    mark = _apply_mark_options(mark, opts)
    if mark and words and words[-1][-1] not in ".,?!":
        words[-1] += mark


def _clean_token(token: str, opts: SanitizeOptions) -> list[str]:
    """Spoken words of one whitespace token (markdown and symbols removed)."""
    t = token.replace("’", "'").replace("‘", "'").replace("`", "")
    t = _LINK_TARGET.sub("", t)
    t = _TAG.sub(" ", t)
    if _URL.match(t.lstrip("([{<\"'*_~!")):
        return []
    if opts.spell_symbols:
        t = _CURRENCY_AMOUNT.sub(lambda m: f"{m.group(2)} {_CURRENCY[m.group(1)]} ", t)
        t = _NEGATIVE.sub("minus ", t)
        for symbol, word in _SYMBOL_WORDS.items():
            t = t.replace(symbol, f" {word} ")
    t = _DASH_RUN.sub(" , ", t).replace("…", ".")
    t = _CLOCK.sub(" ", t)
    t = re.sub(r"[-/\\|_]", " ", t)
    t = _KEPT.sub("", t)
    out: list[str] = []
    prev_end = 0
    for match in _WORD.finditer(t):
        if out:
            _attach(out, _mark_of(t[prev_end : match.start()]), opts)
        out.extend(_normalise_word(match.group(), opts))
        prev_end = match.end()
    if out:
        _attach(out, _mark_of(t[prev_end:]), opts)
    return out


def _normalise_word(word: str, opts: SanitizeOptions) -> list[str]:
    if opts.numbers == "spell" and _NUMBER.fullmatch(word):
        spoken = spell_number(word).split()
    else:
        spoken = [word]
    if opts.case == "lower":
        spoken = [w.lower() for w in spoken]
    return spoken
