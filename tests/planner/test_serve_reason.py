"""The SLA search's `rejected` keys (planner/serving/search.py `_reason`): a refusal's first clause cut at a word to
80 characters with no parenthesis left open, whatever the clause's parentheses (review r13b #5)."""

from __future__ import annotations

import pytest

from planner.serving.search import _reason

WORDS = " ".join(f"w{i:02d}" for i in range(30))  # 30 words of 3 letters: 119 characters


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        # a short clause is kept whole, the rest after ";" dropped
        ("must be >= 1, got 0; see docs", "must be >= 1, got 0"),
        # a plain long clause: cut at the last space before 80 characters (words of 4 characters with their space)
        (WORDS, " ".join(f"w{i:02d}" for i in range(20)) + " …"),
        # the clause opens with "(" and is cut inside it: the words kept, not " …" (an empty key before)
        (f"({WORDS}) tail", " ".join(f"w{i:02d}" for i in range(19)) + " …"),
        # nested parentheses, the outer one open at the cut: cut before the outer one, not the inner one
        (f"a (b (c) {WORDS}) tail", "a …"),
        # the inner one closed and the outer one closed before the cut: nothing cut for them
        (f"a (b (c) d) {WORDS}", "a (b (c) d) " + " ".join(f"w{i:02d}" for i in range(17)) + " …"),
    ],
)
def test_reason_cuts_at_a_word_and_leaves_no_parenthesis_open(rule, expected):
    why = _reason(rule)
    assert why == expected
    assert len(why) <= 82 and why.strip(" …") and _balanced(why)
