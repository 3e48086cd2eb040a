"""The native digest helpers a pack session's feed uses (no Python object per blob)."""

from __future__ import annotations

import os

import pytest

from checkpointd import _native

A, B, C = (os.urandom(32) for _ in range(3))


def test_digests_without_keeps_the_order_of_a_and_each_digest_once() -> None:
    assert _native.digests_without(C + A + B + A, B) == C + A
    assert _native.digests_without(A + B, b"") == A + B
    assert _native.digests_without(b"", A) == b""


def test_sort_digests_sorts_and_drops_repeats() -> None:
    assert _native.sort_digests(C + A + B + A) == b"".join(sorted({A, B, C}))


def test_a_digest_set_takes_each_digest_once() -> None:
    taken = _native.DigestSet()
    assert taken.take_new(A + B + A) == A + B
    assert taken.take_new(B + C) == C
    assert len(taken) == 3 and A in taken and os.urandom(32) not in taken
    assert taken.without(C + os.urandom(0) + A) == b""
    fresh = os.urandom(32)
    assert taken.without(fresh + A + fresh) == fresh


@pytest.mark.parametrize("bad", [b"x" * 31, b"x" * 33])
def test_a_length_not_of_whole_digests_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        _native.digests_without(bad, b"")
    with pytest.raises(ValueError, match="multiple of 32"):
        _native.sort_digests(bad)
    with pytest.raises(ValueError, match="multiple of 32"):
        _native.DigestSet().take_new(bad)
