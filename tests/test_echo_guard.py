"""The echo guard (kame.asr.echo_guard), without torch: the alignment of a hypothesis with the assistant's
recent words, the words kept with their times, and the filter over a session's ASR events (an echo starts
no turn and is reported; the user's speech, even repeating the assistant with words of their own, is
released in order; stale assistant words do not count; nothing to judge, nothing held)."""

from __future__ import annotations

from kame.asr.echo_guard import (
    STEP_S,
    AssistantWords,
    EchoGuard,
    EchoOptions,
    EchoVerdict,
    match_echo,
    normalise,
)
from kame.asr.events import AsrEvent, EventType

SAID = "The capital of France is Paris, a city of 2 million people."


def _said(text: str = SAID, start_s: float = 0.0, per_word_s: float = 0.4) -> list[tuple[str, float]]:
    return [(w, start_s + i * per_word_s) for i, w in enumerate(normalise(text))]


def _echo(hypothesis: str, said: list[tuple[str, float]] | None = None, *, final: bool = True) -> bool:
    return match_echo(normalise(hypothesis), _said() if said is None else said, final=final).is_echo(EchoOptions())


# --------------------------------------------------------------------------- words


def test_words_are_compared_without_case_punctuation_or_digits() -> None:
    assert normalise("Paris, a city of 2 million-ish people!") == \
        ["paris", "a", "city", "of", "two", "million", "ish", "people"]
    assert normalise("It's  ") == ["it's"]
    assert normalise(" ... ") == []


def test_the_assistants_words_are_rebuilt_from_pieces_with_the_step_they_began() -> None:
    words = AssistantWords()
    pieces = ["\u2581The", None, "\u2581cap", "ital", None, None, None, None, "\u2581Par", "is", "."]
    for step, piece in enumerate(pieces):
        words.step(piece, step)
    # "Paris." is still being spelled: it counts (an echo may be of the word in progress)
    assert words.said(0.0, 100.0) == [("the", 0.0), ("capital", 2 * STEP_S), ("paris", 8 * STEP_S)]
    assert words.said(0.1, 0.5) == [("capital", 2 * STEP_S)]
    assert words.spoke_since(10 * STEP_S) and not words.spoke_since(11 * STEP_S)


# --------------------------------------------------------------------------- the alignment


def test_an_echo_is_the_assistants_words_even_mis_heard() -> None:
    assert _echo("The capital of France is Paris.")
    assert _echo("the capitol of france is pairs")  # Whisper mis-hears the echo
    assert _echo("city of two million")  # any stretch of what was said, digits or words
    assert _echo("Paris")
    assert _echo("the capital of france paris")  # a word the ASR dropped


def test_the_user_repeating_the_assistant_with_words_of_their_own_is_the_user() -> None:
    assert not _echo("Yes, Paris.")
    assert not _echo("Paris? Really?")
    assert not _echo("the capital is not Paris")  # a word inserted inside the matched stretch
    assert not _echo("The capital of France is Paris, and what about Spain?")
    assert not _echo("What about Spain?")


def test_a_mis_heard_word_between_matched_ones_is_mis_heard_not_the_users() -> None:
    match = match_echo(normalise("the capital and france"), _said())
    assert (match.matched, match.misheard, match.extra) == (3, 1, 0) and match.is_echo(EchoOptions())


def test_a_long_echos_garbled_first_and_last_words_are_mis_heard_but_a_later_yes_is_the_users() -> None:
    said = _said("It is a beautiful old city, and the capital of France is Paris.", start_s=0.4, per_word_s=0.3)
    garbled = normalise("the immughedly old city and the capital and friends in Paris")  # Whisper on a quiet echo
    match = match_echo(garbled, said, start_s=0.4)  # the utterance began as the assistant did
    assert match.is_echo(EchoOptions()) and match.extra == 0, match
    assert not match_echo(garbled, said, start_s=3.0).is_echo(EchoOptions())  # began too late to echo "It is a"
    assert not match_echo(normalise("yes, Paris"), said, start_s=4.4).is_echo(EchoOptions())
    tail = normalise("old city and the capital of France is Paris bla blah")
    assert not match_echo(tail, said, start_s=1.0).is_echo(EchoOptions())  # nothing said after Paris: the user's


def test_a_partials_cut_last_word_does_not_make_it_the_users() -> None:
    assert _echo("the capital of fra", final=False)
    assert _echo("the capi", final=False)
    assert not _echo("the capi", final=True)
    assert not _echo("yes the capital", final=False)


def test_nothing_to_compare_is_no_echo() -> None:
    assert not _echo("", _said())
    assert not _echo("the capital", [])
    match = match_echo([], [])
    assert (match.words, match.matched, match.extra) == (0, 0, 0)


def test_too_much_mis_heard_is_the_user() -> None:
    said = _said("one two three four five six seven")
    assert _echo("one two tree four five six seven", said)  # similar: the same word
    assert _echo("one blue sky four five six seven", said)  # two of seven beyond recognition: still an echo
    assert not _echo("one blue sky grey dull six seven", said)  # four of seven: not one stretch any more
    options = EchoOptions(max_misheard_fraction=0.2)
    assert not match_echo(normalise("one blue sky four five six seven"), said, options).is_echo(options)


def test_extra_words_allowed_by_the_options() -> None:
    options = EchoOptions(max_extra_words=1)
    assert match_echo(normalise("yes, Paris"), _said(), options).is_echo(options)


# --------------------------------------------------------------------------- the filter over ASR events


def _ev(kind: EventType, text: str = "", audio_s: float = 0.0, utterance: int = 0, stable: str | None = None) -> AsrEvent:
    """An ASR event; a partial's stable words are all its words unless ``stable`` says otherwise."""
    if stable is None:
        stable = text if kind is EventType.PARTIAL else ""
    return AsrEvent(kind, text, audio_s, 0.0, utterance, stable)


def _speak(guard: EchoGuard, text: str, first_step: int, steps_per_word: int = 5) -> int:
    """The assistant says ``text`` from ``first_step``; returns the step after it."""
    step = first_step
    for word in text.split():
        guard.assistant_step("\u2581" + word, step)
        for _ in range(steps_per_word - 1):
            step += 1
            guard.assistant_step(None, step)
        step += 1
    return step


def _kinds(out: list[AsrEvent | EchoVerdict]) -> list[str]:
    return ["echo" if isinstance(o, EchoVerdict) and o.echo else "user" if isinstance(o, EchoVerdict)
            else o.type.value for o in out]


def test_an_echo_starts_no_turn_and_is_reported_at_its_final() -> None:
    guard = EchoGuard()
    end = _speak(guard, "The capital of France is Paris.", first_step=0)  # 30 steps: 2.4 s
    t = end * STEP_S + 0.3  # the echo comes back 0.3 s after the assistant ended... and began 0.3 s after it
    out: list[AsrEvent | EchoVerdict] = []
    out += guard.push(_ev(EventType.SPEECH_STARTED, audio_s=0.6))
    out += guard.push(_ev(EventType.PARTIAL, "the capital of", audio_s=1.4))
    out += guard.push(_ev(EventType.PARTIAL, "the capital of France is", audio_s=2.2))
    out += guard.push(_ev(EventType.SPEECH_STOPPED, audio_s=t + 0.6))
    out += guard.push(_ev(EventType.FINAL, "The capital of France is Paris.", audio_s=t + 0.7))
    assert _kinds(out) == ["echo"]
    verdict = out[0]
    assert isinstance(verdict, EchoVerdict) and verdict.match.matched == 6 and verdict.text.startswith("The capital")
    assert guard.counts == {"held": 1, "echo": 1, "user": 0}
    # the next utterance is judged afresh
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=t + 1.0, utterance=1))
    out += guard.push(_ev(EventType.PARTIAL, "what about", audio_s=t + 1.6, utterance=1))
    assert out == []  # two words: too short to release on a partial (an echo's first partials are often garbled)
    out += guard.push(_ev(EventType.PARTIAL, "what about Spain", audio_s=t + 2.0, utterance=1))
    assert out == []  # nor four: Whisper garbles a quiet echo's first words into anything
    out += guard.push(_ev(EventType.PARTIAL, "what about Spain and Italy", audio_s=t + 2.4, utterance=1))
    assert _kinds(out) == ["user", "speech_started", "partial"]
    assert out[2].text == "what about Spain and Italy"  # type: ignore[union-attr]  # the latest partial


def test_the_user_repeating_with_words_of_their_own_gets_the_turn_in_order() -> None:
    guard = EchoGuard()
    end = _speak(guard, "The capital is Paris.", first_step=0)
    t = end * STEP_S
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=t + 0.2))
    assert out == []  # held: the assistant has just spoken
    out = guard.push(_ev(EventType.PARTIAL, "yes", audio_s=t + 0.6))
    out += guard.push(_ev(EventType.PARTIAL, "yes Paris", audio_s=t + 1.0))
    out += guard.push(_ev(EventType.SPEECH_STOPPED, audio_s=t + 1.6))
    assert out == []  # one word of their own: a partial does not release on that (the final does)
    out = guard.push(_ev(EventType.FINAL, "Yes, Paris.", audio_s=t + 1.7))
    assert _kinds(out) == ["user", "speech_started", "partial", "speech_stopped", "final"]
    assert out[1].audio_s == t + 0.2  # type: ignore[union-attr]  # when the user began, not when released
    assert guard.counts["user"] == 1 and guard.counts["echo"] == 0


def test_the_user_speaking_over_the_assistant_is_released_on_a_partial() -> None:
    guard = EchoGuard()
    _speak(guard, "The capital of France is Paris, a city of two million people.", first_step=0)
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=1.0))
    out += guard.push(_ev(EventType.PARTIAL, "the capital and france", audio_s=1.6))  # the echo, one word mis-heard
    assert out == []
    out += guard.push(_ev(EventType.PARTIAL, "the capital and france hold on what about", audio_s=2.4))
    assert _kinds(out) == ["user", "speech_started", "partial"]  # the user's own words, over the echo


def test_a_user_released_only_at_the_final_gets_every_event_of_the_turn() -> None:
    guard = EchoGuard()
    end = _speak(guard, "The capital is Paris.", first_step=0)
    t = end * STEP_S
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=t + 0.2))
    out += guard.push(_ev(EventType.PARTIAL, "Paris", audio_s=t + 0.6))  # so far an echo: still held
    out += guard.push(_ev(EventType.SPEECH_STOPPED, audio_s=t + 1.4))
    assert out == []
    out = guard.push(_ev(EventType.FINAL, "Paris, right?", audio_s=t + 1.5))
    assert _kinds(out) == ["user", "speech_started", "partial", "speech_stopped", "final"]


def test_a_partial_is_judged_on_its_stable_words_not_its_flickering_tail() -> None:
    guard = EchoGuard()
    _speak(guard, "The capital of France is Paris, a city of two million people.", first_step=0)
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=1.0))
    out += guard.push(_ev(EventType.PARTIAL, "The capital of France in Paris, the Dymham-U", audio_s=3.0,
                          stable="The capital of France in Paris,"))
    assert out == []
    out += guard.push(_ev(EventType.FINAL, "The capital of France is Paris, a city.", audio_s=4.0))
    assert _kinds(out) == ["echo"]
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=4.5, utterance=1))
    out += guard.push(_ev(EventType.PARTIAL, "hold on what about Spain", audio_s=5.5, utterance=1, stable=""))
    assert out == []  # nothing stable yet
    out += guard.push(_ev(EventType.PARTIAL, "hold on what about Spain", audio_s=5.8, utterance=1,
                          stable="hold on what about Spain"))
    assert _kinds(out) == ["user", "speech_started", "partial"]


def test_the_next_utterance_may_start_before_the_held_ones_final() -> None:
    guard = EchoGuard()
    end = _speak(guard, "The capital is Paris.", first_step=0)
    t = end * STEP_S
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=0.6))
    out += guard.push(_ev(EventType.SPEECH_STOPPED, audio_s=t + 0.3))
    out += guard.push(_ev(EventType.SPEECH_STARTED, audio_s=t + 0.8, utterance=1))  # before 0's final
    out += guard.push(_ev(EventType.PARTIAL, "and what about Spain then", audio_s=t + 1.5, utterance=1))
    assert _kinds(out) == ["user", "speech_started", "partial"]
    out = guard.push(_ev(EventType.FINAL, "The capital is Paris.", audio_s=t + 1.6))  # 0's final, late
    out += guard.push(_ev(EventType.FINAL, "And what about Spain?", audio_s=t + 2.5, utterance=1))
    assert _kinds(out) == ["echo", "final"]
    assert [o.utterance for o in out] == [0, 1]  # type: ignore[union-attr]


def test_stale_assistant_words_do_not_suppress_the_user() -> None:
    guard = EchoGuard(EchoOptions(window_s=3.0))
    _speak(guard, "The capital is Paris.", first_step=0)  # over by 1.6 s
    for step in range(20, 200):
        guard.assistant_step(None, step)
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=10.0))
    assert _kinds(out) == ["speech_started"]  # nothing said within the window: no hold
    out = guard.push(_ev(EventType.FINAL, "The capital is Paris.", audio_s=12.0))
    assert _kinds(out) == ["final"]
    assert guard.counts == {"held": 0, "echo": 0, "user": 0}


def test_an_old_sentence_outside_the_window_is_not_matched_while_the_assistant_speaks_again() -> None:
    guard = EchoGuard(EchoOptions(window_s=2.0))
    _speak(guard, "The capital is Paris.", first_step=0)
    end = _speak(guard, "Anything else today?", first_step=100)  # 8 s later
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=end * STEP_S))
    out += guard.push(_ev(EventType.FINAL, "The capital is Paris.", audio_s=end * STEP_S + 1.5))
    assert _kinds(out) == ["user", "speech_started", "final"]


def test_a_noise_held_with_no_words_gives_nothing() -> None:
    guard = EchoGuard()
    end = _speak(guard, "Hello there.", first_step=0)
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=end * STEP_S))
    out += guard.push(_ev(EventType.PARTIAL, "", audio_s=end * STEP_S + 0.4))
    out += guard.push(_ev(EventType.SPEECH_STOPPED, audio_s=end * STEP_S + 0.8))
    out += guard.push(_ev(EventType.FINAL, "", audio_s=end * STEP_S + 0.9))
    assert out == []


def test_a_guard_turned_off_passes_everything_and_cuts_always_pass() -> None:
    guard = EchoGuard(enabled=False)
    end = _speak(guard, "The capital is Paris.", first_step=0)
    events = [_ev(EventType.SPEECH_STARTED, audio_s=end * STEP_S), _ev(EventType.FINAL, "The capital is Paris.",
                                                                        audio_s=end * STEP_S + 1.0),
              _ev(EventType.CUT, audio_s=end * STEP_S + 1.0)]
    assert [o for e in events for o in guard.push(e)] == events
    guard = EchoGuard()
    _speak(guard, "The capital is Paris.", first_step=0)
    assert guard.push(_ev(EventType.SPEECH_STARTED, audio_s=end * STEP_S)) == []
    cut = _ev(EventType.CUT, audio_s=end * STEP_S + 0.1)
    assert guard.push(cut) == [cut]


def test_reset_forgets_the_assistants_words() -> None:
    guard = EchoGuard()
    end = _speak(guard, "The capital is Paris.", first_step=0)
    guard.reset()
    out = guard.push(_ev(EventType.SPEECH_STARTED, audio_s=end * STEP_S))
    assert _kinds(out) == ["speech_started"]
