"""Sentence splitting, the word budget, audio re-chunking, transcript diffing."""

from __future__ import annotations

import re

import pytest

from orchestrator.engines.cascade.segment import (
    MAX_SEGMENT_CHARS,
    Rechunker,
    SentenceSplitter,
    WordBudget,
    join_words,
    new_stable_words,
)

TEXT = (
    "You said: hello world. This is a test, with a fairly long clause here, and more! "
    "Ok? 3.5 is a number\nnext line without an end"
)


def _split(text: str, deltas: list[str]) -> list[str]:
    s = SentenceSplitter()
    out: list[str] = []
    for d in deltas:
        out += s.push(d)
    return [*out, s.flush()]


def test_segments_concatenate_to_the_input_whatever_the_delta_sizes() -> None:
    word_deltas = re.findall(r"\S+\s*|\s+", TEXT)
    char_deltas = list(TEXT)
    for deltas in (word_deltas, char_deltas, [TEXT]):
        assert "".join(_split(TEXT, deltas)) == TEXT


def test_splits_at_sentence_ends_long_clauses_and_newlines() -> None:
    parts = _split(TEXT, re.findall(r"\S+\s*|\s+", TEXT))
    assert parts == [
        "You said: hello world.",
        " This is a test, with a fairly long clause here,",
        " and more!",
        " Ok?",
        " 3.5 is a number\n",
        "next line without an end",
    ]


def test_a_period_is_a_boundary_only_once_whitespace_follows() -> None:
    s = SentenceSplitter()
    assert s.push("It costs 3.") == []
    assert s.push("5 dollars. Then") == ["It costs 3.5 dollars."]


def test_a_run_on_segment_is_cut_at_a_space() -> None:
    run_on = "word " * 100
    parts = _split(run_on, [run_on])
    assert "".join(parts) == run_on
    assert all(len(p.strip()) <= MAX_SEGMENT_CHARS for p in parts)


def test_word_budget_cuts_before_the_first_word_over_the_limit() -> None:
    b = WordBudget(3)
    assert [b.take(d) for d in ["Hel", "lo wor", "ld, how", " are you"]] == [
        "Hel",
        "lo wor",
        "ld, how",
        "",
    ]
    assert b.exhausted and b.words == 3
    b = WordBudget(2)
    assert b.take("one two, three") == "one two,"


def test_word_budget_exactly_at_the_limit_is_not_exhausted() -> None:
    b = WordBudget(2)
    assert b.take("two words") == "two words"
    assert not b.exhausted


@pytest.mark.parametrize("limit", [None, 0])
def test_word_budget_edges(limit: int | None) -> None:
    b = WordBudget(limit)
    out = b.take("some text")
    assert (out, b.exhausted) == (("some text", False) if limit is None else ("", True))


def test_rechunker_emits_fixed_pieces_and_keeps_the_rest() -> None:
    r = Rechunker(4)
    assert r.push(b"abcdef") == [b"abcd"]
    assert r.push(b"gh") == [b"efgh"]
    assert r.push(b"ij") == []
    assert r.flush() == b"ij"
    with pytest.raises(ValueError):
        Rechunker(3)


def test_stable_words_hold_back_the_last_word_and_revisions() -> None:
    assert new_stable_words([], "hello") == []
    assert new_stable_words([], "hello world") == ["hello"]
    assert new_stable_words(["hello"], "oh world again") == []  # revised: wait
    assert new_stable_words(["hello"], "hello world again") == ["world"]
    assert new_stable_words(["hello"], "hello world", final=True) == ["world"]
    assert join_words(0, ["a", "b"]) == "a b"
    assert join_words(2, ["c"]) == " c"
