"""UUIDv7 ids: RFC 9562 layout, time-ordered, unique."""

from __future__ import annotations

import time
import uuid

from checkpointd.ids import new_uuid7


def test_uuid7_layout_order_and_uniqueness() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [new_uuid7() for _ in range(20_000)]
    after_ms = time.time_ns() // 1_000_000
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for text in (ids[0], ids[-1]):
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        # A burst may borrow a few ms ahead; never before the call.
        assert before_ms <= parsed.int >> 80 <= after_ms + 20
