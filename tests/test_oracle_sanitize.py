"""Sanitizer: spoken-style output, and stability of prefixes ending at word boundaries."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kame.oracle.numbers import spell_integer, spell_number
from kame.oracle.sanitize import SanitizeOptions, sanitize, settled_words, spoken_words

WORDS = [
    "hello", "world", "Paris", "capital", "the", "is", "of", "France", "don't", "it's", "3.14", "1,000", "42",
    "1999", "well-known", "e.g.", "U.S.", "café", "naïve", "and/or", "snake_case", "Really?", "Yes!", "wait:",
    "so;", "end.", "comma,", "I", "A", "you're", "x",
]  # fmt: skip
MARKUP = [
    "**", "*", "_", "`", "```", "```python", "#", "##", "-", "*", "+", "•", "1.", "2)", "3.", ">", "[link](https://x.y/z)",
    "[two words](http://a.b)", "https://example.com/a?b=c", "www.foo.org", "<br>", "|", "---", "—", "–", "--", "…",
    "...", "?", "!", ";", ":", ",", ".", "(", ")", '"', "'", "’", "$5", "50%", "&", "+", "=", "@", "°", "😀", "ß", "²",
    "**bold**", "_it_", "`code`", "~~x~~", "word—word", "(aside)", "“quoted”", "-5", "3:30", "#tag",
]  # fmt: skip
SEPS = [" ", " ", " ", " ", "\n", "\n\n", "  ", "\t", " \n", ""]

fragment = st.one_of(st.sampled_from(WORDS), st.sampled_from(MARKUP), st.sampled_from(SEPS), st.sampled_from(SEPS))
texts = st.lists(fragment, max_size=40).map("".join) | st.text(alphabet="ab .,?!-*#_`[]()\n:;'—1", max_size=60)

OPTIONS = [
    SanitizeOptions(),
    SanitizeOptions(keep_question=True, keep_exclamation=True, case="lower", numbers="spell", spell_symbols=False),
]
PROPERTY = settings(max_examples=300, deadline=None)
_ATTACHED_TAIL = re.compile(r"^[.,?!]( |$)")


# --------------------------------------------------------------------------- examples
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("**Paris** is the _capital_ of France!", "Paris is the capital of France."),
        ("## Summary\nHere are three fruits:\n- apples\n- pears\n- bananas\n\nDone.",
         "Summary. Here are three fruits, apples, pears, bananas. Done."),
        ("See [the docs](https://example.com/x) or https://foo.bar now.", "See the docs or now."),
        ("Use `code` here.\n```python\nprint('hi')\n```\nThen go.", "Use code here. Then go."),
        ("The answer—surprisingly—is 42. Really? Yes!", "The answer, surprisingly, is 42. Really. Yes."),
        ("Paris — the capital — is lovely ; truly : nice", "Paris, the capital, is lovely, truly, nice"),
        ("It costs $5 or 50% more & it's well-known, e.g. in the U.S.",
         "It costs 5 dollars or 50 percent more and it's well known, e.g. in the U.S."),
        ("1. First point\n2. Second point", "First point, Second point"),
        ("7. That is all.", "7. That is all."),
        ("don’t “quote” me (please)", "don't quote me please"),
        ("😀 emoji and/or snake_case ~~strike~~", "emoji and or snake case strike"),
        ("Hello , world ?", "Hello, world."),
        ("   many    spaces\there  ", "many spaces here"),
        ("> quoted line\n> more", "quoted line. more"),
        ("", ""),
        ("** -- ` ``` ", ""),
    ],
)  # fmt: skip
def test_examples(text: str, expected: str) -> None:
    assert sanitize(text) == expected


def test_options() -> None:
    text = "Is it 42? Wow! It costs $1,250 & 3.5% more."
    assert sanitize(text) == "Is it 42. Wow. It costs 1,250 dollars and 3.5 percent more."
    kept = SanitizeOptions(keep_question=True, keep_exclamation=True)
    assert sanitize(text, kept) == "Is it 42? Wow! It costs 1,250 dollars and 3.5 percent more."
    spelled = SanitizeOptions(numbers="spell", case="lower")
    assert sanitize(text, spelled) == (
        "is it forty two. wow. it costs one thousand two hundred fifty dollars and three point five percent more."
    )
    assert sanitize("a & b = c", SanitizeOptions(spell_symbols=False)) == "a b c"


def test_numbers() -> None:
    assert spell_integer(0) == "zero"
    assert spell_integer(15) == "fifteen"
    assert spell_integer(90) == "ninety"
    assert spell_integer(101) == "one hundred one"
    assert spell_integer(1_000_001) == "one million one"
    assert spell_integer(2_500_000_000) == "two billion five hundred million"
    assert spell_number("1,234.05") == "one thousand two hundred thirty four point zero five"
    with pytest.raises(ValueError):
        spell_integer(-1)


# --------------------------------------------------------------------------- properties
@PROPERTY
@given(text=texts, opt=st.sampled_from(OPTIONS))
def test_output_is_spoken_text(text: str, opt: SanitizeOptions) -> None:
    out = sanitize(text, opt)
    assert out == out.strip() and "  " not in out
    allowed = r"[^\W_]|[' .,]" + (r"|\?" if opt.keep_question else "") + (r"|!" if opt.keep_exclamation else "")
    assert re.fullmatch(f"(?:{allowed})*", out), out
    for word in out.split(" ") if out else []:
        assert re.search(r"[^\W_]", word), (word, out)  # no punctuation-only words
        assert not re.search(r"[.,?!]{2}$", word), (word, out)  # one mark per word end


@PROPERTY
@given(text=texts, opt=st.sampled_from(OPTIONS))
def test_prefix_at_word_boundary_is_stable(text: str, opt: SanitizeOptions) -> None:
    """For P = text[:i] with text[i] whitespace: sanitize(text) = sanitize(P) + R, where R is
    empty, starts with a space, or is one mark attached to P's last word then a space or the end."""
    full = sanitize(text, opt)
    for i, ch in enumerate(text):
        if not ch.isspace():
            continue
        head = sanitize(text[:i], opt)
        if not head:
            continue
        assert full.startswith(head), (text[:i], head, full)
        rest = full[len(head) :]
        assert rest == "" or rest[0] == " " or _ATTACHED_TAIL.match(rest), (text[:i], head, full)


@PROPERTY
@given(text=texts, opt=st.sampled_from(OPTIONS))
def test_settled_words_never_change(text: str, opt: SanitizeOptions) -> None:
    """settled_words of every prefix is a prefix of the final words and grows monotonically."""
    final = spoken_words(text, opt)
    previous: list[str] = []
    for i in range(len(text) + 1):
        now = settled_words(text[:i], opt)
        assert now == final[: len(now)], (text[:i], now, final)
        assert now[: len(previous)] == previous
        previous = now


@PROPERTY
@given(text=texts, opt=st.sampled_from(OPTIONS))
def test_a_following_word_settles_everything_before_it(text: str, opt: SanitizeOptions) -> None:
    extended = text + " zzz"
    final = spoken_words(extended, opt)
    settled = settled_words(extended, opt)
    assert final[: len(settled)] == settled
    assert len(final) - len(settled) <= 1
    if len(final) > len(settled):
        assert final[-1] == "zzz"


def test_settled_words_examples() -> None:
    assert settled_words("Hello there") == ["Hello"]
    assert settled_words("Hello there ") == ["Hello"]  # "there" may still get a comma
    assert settled_words("Hello there ,") == ["Hello"]
    assert settled_words("Hello there , fr") == ["Hello", "there,"]
    assert settled_words("apples\n") == []
    assert settled_words("apples\n- pe") == ["apples."]
    assert settled_words("- apples\n- pe") == ["apples,"]
    assert settled_words("Paris **") == ["Paris"]
