"""The did-you-mean of `wb config check` (courier/config_check.py): within two edits of a known key's last name."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from courier.config_check import _edits, suggestion


@pytest.mark.parametrize(
    ("name", "near"),
    [
        ("profiels", "agents.profiles"),  # two letters swapped: one edit
        ("sesion_move", "session_move"),
        ("targts", "session_move.targets"),
        ("max_session_per_machine", "courier.max_sessions_per_machine"),
        ("idle", "courier.idle"),  # in the wrong section: the section it belongs to
        ("sandbx", "sandbox"),
        ("provders", "agents.providers"),
        ("zebra", None),
        ("ab", None),  # two edits would turn a two-letter name into anything
    ],
)
def test_the_nearest_known_key_is_suggested(name: str, near: str | None) -> None:
    assert suggestion(name) == near


words = st.text(alphabet="abcdef_", max_size=8)


@given(words, words)
def test_edits_are_a_distance(a: str, b: str) -> None:
    assert _edits(a, b) == _edits(b, a)
    assert (_edits(a, b) == 0) == (a == b)
    assert abs(len(a) - len(b)) <= _edits(a, b) <= max(len(a), len(b))


@given(words, st.integers(0, 7))
def test_a_swap_of_neighbours_is_one_edit(word: str, at: int) -> None:
    assume(at < len(word) - 1 and word[at] != word[at + 1])
    swapped = word[:at] + word[at + 1] + word[at] + word[at + 2 :]
    assert _edits(word, swapped) == 1
