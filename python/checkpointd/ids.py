"""Identifiers the daemon makes: UUIDv7 (RFC 9562), so ids sort by creation time."""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_last_counter = 0


def new_uuid7() -> str:
    """A fresh UUIDv7 string; ids made by one process are strictly increasing.

    Layout: 48-bit Unix ms timestamp, version 7, a 12-bit counter seeded randomly
    each millisecond (RFC 9562 method 1, so ids made within one ms still sort),
    variant 0b10, 62 random bits.
    """
    global _last_ms, _last_counter
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            # Seed below 2**11 so a burst in one ms has room to count up.
            _last_counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _last_counter += 1
            if _last_counter > 0xFFF:
                # Counter exhausted: borrow the next millisecond (clock stays monotonic).
                _last_ms += 1
                _last_counter = 0
        ms, counter = _last_ms, _last_counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
