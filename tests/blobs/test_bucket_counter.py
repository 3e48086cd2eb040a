"""The request counter the benchmarks and pack tests rely on counts exactly."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests.fixtures.bucket_counter import classify, counted
from tests.fixtures.s3 import S3Server

pytestmark = pytest.mark.s3


def test_classify_names_each_s3_operation() -> None:
    assert classify("GET", "/bucket?list-type=2&prefix=a", {}) == "LIST"
    assert classify("GET", "/bucket/", {}) == "LIST"
    assert classify("GET", "/bucket/a/b", {}) == "GET"
    assert classify("GET", "/bucket?uploads&prefix=a", {}) == "MULTIPART_LIST"
    assert classify("PUT", "/bucket/a?partNumber=2&uploadId=x", {}) == "MULTIPART_PART"
    assert classify("PUT", "/bucket/a", {"x-amz-copy-source": "/bucket/b"}) == "COPY"
    assert classify("POST", "/bucket/a?uploads", {}) == "MULTIPART_CREATE"
    assert classify("POST", "/bucket/a?uploadId=x", {}) == "MULTIPART_COMPLETE"
    assert classify("DELETE", "/bucket/a?uploadId=x", {}) == "MULTIPART_ABORT"
    assert classify("POST", "/bucket?delete", {}) == "DELETE_MANY"


async def _parts(n: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"z" * (5 << 20)


async def test_every_request_is_counted_by_kind(s3_server: S3Server) -> None:
    with counted(s3_server) as (via, proxy):
        blobs = via.open(f"counter-{uuid.uuid4().hex}")
        assert proxy.snapshot() == {}
        for i in range(7):
            await blobs.put(f"k/{i}", b"x" * i)
        await blobs.put("k/big", _parts(3))  # 15 MiB: a multipart upload
        assert await blobs.head("k/1") is not None
        assert await blobs.head("k/absent") is None
        assert await blobs.get("k/3") == b"xxx"
        assert len(await blobs.list("k")) == 8
        counts = proxy.reset()
        assert counts == {
            "PUT": 7,
            "MULTIPART_CREATE": 1,
            "MULTIPART_PART": 3,
            "MULTIPART_COMPLETE": 1,
            "HEAD": 3,  # one is the if-absent check before the multipart upload
            "GET": 1,
            "LIST": 1,
        }
        assert proxy.total == 0
        await blobs.delete("k/0")
        assert proxy.total == 1
