"""agent.hints.REASON_SENTENCES: one plain sentence for every reason code, and no other."""

from __future__ import annotations

from agent import hints


def test_every_reason_code_has_exactly_one_sentence() -> None:
    assert set(hints.REASON_SENTENCES) == set(hints.REASONS)


def test_sentences_are_one_plain_sentence_each() -> None:
    for code, text in hints.REASON_SENTENCES.items():
        assert text[:1].isalpha() and text.endswith("."), code
        assert "\n" not in text and len(text) <= 160, code
        assert code not in text, code  # the sentence explains the code, it does not repeat it
