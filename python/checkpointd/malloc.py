"""The C allocator's settings a long-lived process needs (glibc ``mallopt``)."""

from __future__ import annotations

import ctypes

_M_MMAP_THRESHOLD = -3
# Buffers of at least this size are mappings of their own.
MMAP_THRESHOLD_BYTES = 256 << 10


def return_large_buffers_to_the_os() -> None:
    """Pin glibc's mmap threshold: streaming moves MiB-sized buffers through
    several threads (grpc, the spool, the bucket client), and glibc would raise
    the threshold to their size and keep the freed buffers in its heaps, so a
    long-lived process's RSS would carry them. Fixed, each such buffer is its
    own mapping, unmapped when freed. No-op without glibc."""
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass
