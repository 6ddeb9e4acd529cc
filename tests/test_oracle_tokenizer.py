"""Word-stable tokenizer against real SentencePiece models (unigram and BPE) trained here.

Also: Moshi-style pieces -> words round trip with the same models.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable

import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from kame.oracle.pieces import PieceWords
from kame.oracle.sanitize import SanitizeOptions, sanitize, settled_words, spoken_words
from kame.oracle.switch import FeedState, decide_switch
from kame.oracle.word_tokenizer import WordStreamTokenizer

SENTENCES = """\
Hello there, how can I help you today.
The capital of France is Paris, a city on the river Seine.
Sure, I can explain that in a few words.
Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.
That is a great question, let me think about it for a moment.
The meeting starts at three thirty in the afternoon.
David has three sisters, and each of them has one brother.
So David has no brothers, he is the only boy in the family.
Water boils at one hundred degrees Celsius at sea level.
I would recommend a short walk after lunch, it helps digestion.
The moon orbits the earth about once every twenty seven days.
Yes, you can cancel the order before it ships.
No, that flight leaves from the other terminal.
Honestly, the best way to learn a language is to speak it every day.
A triangle has three sides and its angles add up to one hundred eighty degrees.
The quick brown fox jumps over the lazy dog.
Let me check, it looks like the weather will be sunny tomorrow.
You should drink enough water, especially when it is hot outside.
The store opens at nine in the morning and closes at eight in the evening.
Machine learning models learn patterns from data.
A neural network is made of layers of simple units.
Speech recognition turns spoken words into text.
The train to London takes about two hours.
Thank you, that was very helpful.
Could you repeat that, please.
I think the answer is forty two.
The Pacific is the largest ocean on earth.
Mount Everest is the highest mountain in the world.
The human heart beats about one hundred thousand times a day.
Bananas are rich in potassium.
My favourite season is autumn, when the leaves change colour.
The café around the corner serves excellent coffee.
It is a naïve approach, but it works well enough.
Rome was not built in a day.
The library is closed on Sundays.
Please remember to bring your passport.
The recipe needs two eggs, flour, sugar and a little butter.
Cook the pasta for about ten minutes, then drain it.
The museum has a large collection of paintings.
Exercise improves your mood and your sleep.
The sun is a star at the centre of our solar system.
Light travels faster than sound.
Electric cars are becoming more popular every year.
The password must have at least eight characters.
Turn left at the next corner, then go straight ahead.
The concert was amazing, the band played for three hours.
I don't know, but I can find out for you.
It's raining, so take an umbrella with you.
We're almost there, just five more minutes.
They've already finished their homework.
She's a doctor and he's a teacher.
Good morning, did you sleep well.
Good night, see you tomorrow.
What time is it.
Where is the nearest station.
Why is the sky blue.
Because sunlight is scattered by the air, and blue light scatters the most.
How many legs does a spider have.
A spider has eight legs.
The answer is simple, just divide the total by the number of people.
Twelve divided by four is three.
Seven times eight is fifty six.
The year two thousand was a leap year.
Shakespeare wrote Hamlet and Macbeth.
The Great Wall of China is very long.
Tokyo is the capital of Japan.
Berlin is the capital of Germany.
Madrid is the capital of Spain.
A healthy breakfast gives you energy for the day.
Reading before bed can help you relax.
Don't forget to save your work.
The computer restarted after the update.
Your appointment is on Monday at ten.
I'm sorry, I didn't catch that.
That sounds like a wonderful plan.
Let's start with the first question.
The results were better than expected.
Dogs and cats are the most common pets.
Penguins cannot fly, but they swim very well.
The ocean covers most of the planet.
Plants need sunlight to grow.
Bread is made from flour, water, yeast and salt.
A kilometre is a thousand metres.
An hour has sixty minutes.
The price went up by ten percent.
It costs about five dollars.
The temperature dropped below zero last night.
Snow fell all over the city.
The children played in the park until sunset.
He finished the marathon in under four hours.
The bridge was built more than a hundred years ago.
Well, it depends on what you want to achieve.
In short, yes, it is possible.
First, open the settings, then choose the network.
Second, enter your password and press connect.
Finally, restart the device.
Of course, I am happy to help.
Absolutely, that is correct.
Not quite, the correct answer is Paris.
Interesting, tell me more about it.
"""

FILLERS = ["Well,", "Sure.", "Okay,", "Right.", "Yes,", "Actually,", "In fact,", "So,"]


def corpus_lines() -> list[str]:
    base = [line for line in SENTENCES.splitlines() if line]
    lines = list(base)
    for i, (a, b) in enumerate(itertools.combinations(base[:40], 2)):
        if i % 7 == 0:
            lines.append(f"{FILLERS[i % len(FILLERS)]} {a.lower()} {b}")
    for n, line in enumerate(base):
        lines.append(f"{line[:-1]}, number {n}, or {n * 37 % 1000}.")
    return lines


def train(model_type: str, vocab_size: int) -> spm.SentencePieceProcessor:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


@pytest.fixture(scope="module", params=[("unigram", 600), ("bpe", 400)], ids=["unigram", "bpe"])
def sp(request: pytest.FixtureRequest) -> spm.SentencePieceProcessor:
    return train(*request.param)


def encoder(sp: spm.SentencePieceProcessor) -> Callable[[str], list[int]]:
    return lambda text: sp.encode(text, out_type=int)


def test_corpus_and_models(sp: spm.SentencePieceProcessor) -> None:
    assert len(corpus_lines()) >= 300
    assert 300 <= sp.get_piece_size() <= 1000
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)


# --------------------------------------------------------------------------- streaming == one encode
WORDS = [
    "hello",
    "there",
    "Paris",
    "capital",
    "the",
    "is",
    "of",
    "France",
    "don't",
    "it's",
    "3.14",
    "1,000",
    "42",
    "café",
    "naïve",
    "well-known",
    "e.g.",
    "I",
    "x",
]
MARKUP = ["**", "_", "`", "#", "-", "1.", "[a link](http://x.y)", "https://e.com", "—", "--", "…", "?", "!", ";",
          ":", ",", ".", "(", ")", '"', "’", "$5", "50%", "&", "😀", "ß", "word—word", "Really?", "end."]  # fmt: skip
SEPS = [" ", " ", " ", " ", "\n", "\n\n", "  "]
answers = st.lists(st.sampled_from(WORDS) | st.sampled_from(MARKUP) | st.sampled_from(SEPS), max_size=40).map("".join)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(text=answers, cuts=st.lists(st.integers(0, 400), max_size=30), lower=st.booleans())
def test_streamed_ids_equal_one_encode(sp: spm.SentencePieceProcessor, text: str, cuts: list[int], lower: bool) -> None:
    encode = encoder(sp)
    opts = SanitizeOptions(case="lower" if lower else "keep")
    tok = WordStreamTokenizer(encode, options=opts)
    received = ""
    yielded: list[int] = []
    for chunk in chunked(text, cuts):
        received += chunk
        yielded += tok.feed(chunk)
        assert yielded == encode(" ".join(settled_words(received, opts))), received
        assert list(tok.ids) == yielded
    yielded += tok.flush()
    assert yielded == encode(sanitize(text, opts))
    assert tok.resyncs == 0
    assert tok.text == sanitize(text, opts)


GPT_STYLE = [
    ["Hello", " there", ",", " how", " can", " I", " help", "?"],
    ["The", " capital", " of", " France", " is", " Paris", "."],
    ["Sure", ",", " I", " can", " explain", " that", "."],
    ["**", "Photos", "ynthesis", "**", " turns", " light", " into", " sugar", "."],
    ["Seven", " times", " eight", " is", " fifty", " six", "."],
    ["Absolutely", ".", " That", " is", " correct", "."],
]


def test_first_yield_is_exactly_the_first_word(sp: spm.SentencePieceProcessor) -> None:
    """The engine resets the FIFO with [start, *first yield]: it must be the first word's ids."""
    encode = encoder(sp)
    sizes = []
    for chunks in GPT_STYLE:
        tok = WordStreamTokenizer(encode)
        first: list[int] = []
        for i, chunk in enumerate(chunks):  # noqa: B007 - i is read after the loop
            first = tok.feed(chunk)
            if first:
                break
        words = spoken_words("".join(chunks))
        assert first == encode(words[0])
        # It arrives with the chunk that starts the second word.
        assert "".join(chunks[: i + 1]).split()[-1][0].isalpha()
        assert 1 <= len(first) <= len(words[0]) + 1
        sizes.append(len(first))
    print(f"ids in the first yield: {sizes}")


def test_max_words_cuts_and_reports_done(sp: spm.SentencePieceProcessor) -> None:
    encode = encoder(sp)
    tok = WordStreamTokenizer(encode, max_words=3)
    out = tok.feed("one two three")
    assert not tok.done and out == encode("one two")
    out += tok.feed(" four")
    assert tok.done and out == encode("one two three")
    assert tok.feed(" six seven ") == [] and tok.flush() == []
    assert tok.words == ("one", "two", "three")
    with pytest.raises(RuntimeError):
        tok.feed("more")


def test_continuation_appends_only_new_words(sp: spm.SentencePieceProcessor) -> None:
    encode = encoder(sp)
    old = WordStreamTokenizer(encode)
    fed = old.feed("Paris is the capital")
    assert old.words == ("Paris", "is", "the")
    new_answer = "Paris is the capital of France, on the Seine."
    decision = decide_switch(
        "keep_if_same_start",
        FeedState(turn_id=1, fed_words=old.words),
        answer_turn_id=1,
        current_turn_id=1,
        answer_words=settled_words(new_answer),
        answer_complete=False,
    )
    assert decision.action == "append" and decision.skip_words == 3
    cont = old.continuation(decision.skip_words)
    for chunk in chunked(new_answer, [3, 9, 17, 30]):
        fed += cont.feed(chunk)
    fed += cont.flush()
    assert fed == encode(sanitize(new_answer))


# --------------------------------------------------------------------------- a tokenizer that is not word-local
class MergingEncoder:
    """Word ids, except that "of the" becomes ONE id (like a model with pieces across spaces)."""

    MERGED = 10_000

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str) -> list[int]:
        words, out, i = text.split(), [], 0
        while i < len(words):
            if words[i] == "of" and i + 1 < len(words) and words[i + 1] == "the":
                out.append(self.MERGED)
                i += 2
            else:
                out.append(self.vocab.setdefault(words[i], len(self.vocab)))
                i += 1
        return out

    def decode(self, ids: list[int]) -> str:
        names = {v: k for k, v in self.vocab.items()} | {self.MERGED: "of the"}
        return " ".join(names[i] for i in ids)


def test_resync_keeps_yielded_ids_and_loses_no_text() -> None:
    enc = MergingEncoder()
    tok = WordStreamTokenizer(enc)
    ids = tok.feed("the end of") + tok.feed(" the")
    assert tok.words == ("the", "end", "of") and tok.resyncs == 0
    ids += tok.feed(" story") + tok.flush()
    # "of" was yielded before "the" arrived; the re-encode wants one merged id instead.
    assert tok.resyncs == 1
    assert enc.decode(ids) == "the end of the story"
    assert ids != enc("the end of the story")
    assert ids == enc("the end of") + enc("the story")  # two segments, split at a word boundary


@settings(max_examples=150, deadline=None)
@given(
    words=st.lists(st.sampled_from(["of", "the", "a", "b", "of", "the"]), min_size=1, max_size=12),
    cuts=st.lists(st.integers(0, 100), max_size=12),
    lookahead=st.sampled_from([0, 1]),
)
def test_unstable_tokenizer(words: list[str], cuts: list[int], lookahead: int) -> None:
    enc = MergingEncoder()
    text = " ".join(words)
    tok = WordStreamTokenizer(enc, lookahead_words=lookahead)
    ids: list[int] = []
    for chunk in chunked(text, cuts):
        ids += tok.feed(chunk)
        assert list(tok.ids) == ids
    ids += tok.flush()
    assert enc.decode(ids) == text  # nothing lost, nothing repeated
    if lookahead == 1:
        assert tok.resyncs == 0 and ids == enc(text)  # one word of lookahead absorbs bigram merges
    elif tok.resyncs == 0:
        assert ids == enc(text)


def test_lookahead_delays_by_one_word() -> None:
    enc = MergingEncoder()
    tok = WordStreamTokenizer(enc, lookahead_words=1)
    assert tok.feed("a b c") == enc("a")  # settled: a b; one held back
    assert tok.feed(" d") == enc("a b")[1:]  # settled: a b c
    assert tok.flush() == enc("a b c d")[2:]


# --------------------------------------------------------------------------- pieces -> words
def test_pieces_round_trip(sp: spm.SentencePieceProcessor) -> None:
    text = "Photosynthesis turns light, water and carbon dioxide into sugar. Don't panic, it's naïve."
    ids = sp.encode(text, out_type=int)
    assert len(ids) > len(text.split())  # some words take several pieces
    words_out: list[str] = []
    assembler = PieceWords(sp.id_to_piece)
    for token in ids:
        words_out += assembler.push(token)
        words_out += assembler.push(3)  # pads between pieces must not split words ...
        if token % 2:
            words_out += assembler.push(0)
    words_out += assembler.flush()
    assert " ".join(words_out) == text


def test_moshi_piece_stream_with_pads_ends_words(sp: spm.SentencePieceProcessor) -> None:
    assembler = PieceWords(sp.id_to_piece, idle_steps_end_word=2)
    out: list[str] = []
    for token in sp.encode("Hello there", out_type=int):
        out += assembler.push(token)
    assert out == ["Hello"] and assembler.pending == "there"
    out += assembler.push(3)
    assert out == ["Hello"]
    out += assembler.push(3)
    assert out == ["Hello", "there"] and assembler.pending == ""
