"""Identifiers the daemon makes: UUIDv7 (RFC 9562), so ids sort by creation
time, and the UUIDv8 a capture's request_id names (``derive_request_id``)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid

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


# A checkpoint id derived from a capture's request_id is a UUIDv8 (RFC 9562)
# bound to its thread: the first 60 custom bits are the thread's tag, the last
# 62 the request's. The same (thread, request_id) always gives the same id, so
# a retry finds what the first attempt stored; and whoever holds the id can
# tell which thread it belongs to (``names_another_thread``), so a gateway
# refuses one appended on any other thread: a tenant cannot take, or mark
# spent, the id another tenant's request_id will name. Earlier daemons derived
# UUIDv5 ids (SHA-1 of the namespace, thread NUL request_id); they stay
# request-derived (``is_request_derived``) but carry no tag.
_THREAD_TAG = b"checkpointd thread\x00"
_REQUEST_PART = b"checkpointd request\x00"


def _digest_bits(prefix: bytes, *parts: str, bits: int) -> int:
    data = prefix + b"\x00".join(p.encode("utf-8", "surrogatepass") for p in parts)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> (64 - bits)


def _thread_tag(thread_id: str) -> int:
    return _digest_bits(_THREAD_TAG, thread_id, bits=60)


def derive_request_id(thread_id: str, request_id: str) -> str:
    """The checkpoint id a capture of ``thread_id`` with ``request_id`` gets.

    Layout: the thread's 60-bit tag (48 bits, version 8, 12 bits), variant
    0b10, 62 bits of the request's digest."""
    tag = _thread_tag(thread_id)
    request = _digest_bits(_REQUEST_PART, thread_id, request_id, bits=62)
    value = (tag >> 12) << 80 | 0x8 << 76 | (tag & 0xFFF) << 64 | 0b10 << 62 | request
    return str(uuid.UUID(int=value))


def _canonical(checkpoint_id: str) -> uuid.UUID | None:
    try:
        parsed = uuid.UUID(checkpoint_id)
    except (ValueError, TypeError, AttributeError):
        return None
    return parsed if str(parsed) == checkpoint_id else None


def is_request_derived(checkpoint_id: str) -> bool:
    """Whether ``checkpoint_id`` is one a daemon derives from a request_id
    (canonical UUIDv8 text, or the UUIDv5 of earlier daemons)."""
    parsed = _canonical(checkpoint_id)
    return parsed is not None and parsed.version in (5, 8)


def names_another_thread(checkpoint_id: str, thread_id: str) -> bool:
    """Whether ``checkpoint_id`` has the form of a request-derived id
    (UUIDv8) bound to a thread other than ``thread_id``."""
    parsed = _canonical(checkpoint_id)
    if parsed is None or parsed.version != 8:
        return False
    value = parsed.int
    tag = (value >> 80) << 12 | (value >> 64) & 0xFFF
    return tag != _thread_tag(thread_id)
