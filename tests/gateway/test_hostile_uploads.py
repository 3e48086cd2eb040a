"""What a peer can make the gateway hold: real `checkpointd gateway` processes
(SQLite store, SeaweedFS bucket), their memory read from /proc.

* A peer without a token is refused on its headers: the gateway's peak RSS
  stays within 100 MiB of idle while it sends 300 MiB (or 100 MiB, under the
  request limit), and an upload stream is refused while it is still sending.
* A batch upload (BlobPutMany) is stored as it arrives, never held whole.
* A 67 KB pack of zstd frames that claim 1 GiB of zeros each is refused from
  its trailer and never stored; with limits raised to let it through, it is
  checked streaming, in bounded memory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import grpc
import pytest

from checkpointd.gateway import tokens
from checkpointd.gateway.remote import GatewayConnection, RemoteBlobStore
from checkpointd.service.auth import bearer_metadata
from checkpointd.v1 import gateway_pb2 as gpb
from checkpointd.v1 import gateway_pb2_grpc as gpb_grpc
from tests.fixtures.s3 import S3Server

from .process import GatewayProcess, start_gateway, wait_serving

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]

MIB = 1 << 20
# The goal: what a hostile peer adds to the gateway's RSS.
MAX_GROWTH_MIB = 100
# A zstd frame of zeros: RLE blocks of this many bytes, 4 bytes each.
ZSTD_BLOCK = 128 << 10


@dataclass
class Setup:
    base: Path
    private: Path
    public: Path
    s3: S3Server

    def token(self, **kwargs: object) -> str:
        options: dict[str, object] = {"threads": ["t"], "ops": ["capture"], "ttl_s": 600}
        options.update(kwargs)
        return tokens.mint(tokens.load_signing_key(self.private), tokens.TokenGrant(**options))  # type: ignore[arg-type]

    def gateway(self, name: str, *extra: str) -> tuple[GatewayProcess, str]:
        prefix = f"hostile-{name}-{uuid.uuid4().hex}"
        gateway = start_gateway(
            self.base,
            name,
            store=f"sqlite:///{self.base / (name + '.db')}",
            blobs=self.s3.url(prefix),
            public_key=self.public,
            env=self.s3.env(),
            extra=extra,
        )
        wait_serving(gateway)
        return gateway, prefix


@pytest.fixture(scope="module")
def setup(s3_server: S3Server) -> Iterator[Setup]:
    base = Path(tempfile.mkdtemp(prefix="cpd-hostile-", dir="/tmp"))
    public = tokens.generate_key(base / "key.pem")
    yield Setup(base, base / "key.pem", public, s3_server)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def gateway(setup: Setup) -> Iterator[tuple[GatewayProcess, str]]:
    started = setup.gateway("gw")
    yield started
    started[0].stop()


def _channel(gateway: GatewayProcess) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        gateway.address, options=[("grpc.max_send_message_length", 512 * MIB)]
    )


async def _settled_rss(gateway: GatewayProcess, token: str) -> float:
    """The RSS once an authenticated call has been served (imports warm)."""
    async with _channel(gateway) as channel:
        stub = gpb_grpc.GatewayStub(channel)
        await stub.GetStoreInfo(gpb.GatewayStoreInfoRequest(), metadata=bearer_metadata(token))
    await asyncio.sleep(0.5)
    gateway.reset_peak()
    return gateway.rss_mib()


# 300 MiB is over the request limit, 100 MiB under it: neither is read.
@pytest.mark.parametrize("size_mib", [300, 100])
async def test_a_tokenless_request_is_refused_before_it_is_read(
    setup: Setup, gateway: tuple[GatewayProcess, str], size_mib: int
) -> None:
    process, _ = gateway
    idle = await _settled_rss(process, setup.token())
    document = b"x" * (size_mib * MIB)
    async with _channel(process) as channel:
        stub = gpb_grpc.GatewayStub(channel)
        for metadata in ((), bearer_metadata("not-a-token")):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Append(
                    gpb.GatewayAppendRequest(document=document), metadata=metadata, timeout=60
                )
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value
    peak = process.peak_mib()
    print(f"tokenless {size_mib} MiB Append: idle {idle:.0f} MiB, peak {peak:.0f} MiB")
    assert peak - idle < MAX_GROWTH_MIB, (idle, peak)


async def test_a_tokenless_upload_is_refused_while_it_is_still_sending(
    setup: Setup, gateway: tuple[GatewayProcess, str]
) -> None:
    process, _ = gateway
    idle = await _settled_rss(process, setup.token())
    chunks = 300
    sent = 0

    async def body() -> object:
        nonlocal sent
        for _ in range(chunks):
            sent += 1
            yield gpb.GatewayBlobChunk(key="sandbox-files/blake3/" + "0" * 64, data=bytes(MIB))
            await asyncio.sleep(0)

    codes: list[grpc.StatusCode] = []
    async with _channel(process) as channel:
        stub = gpb_grpc.GatewayStub(channel)
        # A write in flight when the gateway closes the stream makes the
        # client library report its own INTERNAL "execute_batch" failure
        # instead of the gateway's status: such attempts are tried again.
        for _attempt in range(3):
            sent = 0
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.BlobPut(body(), timeout=60)
            codes.append(caught.value.code())
            lost_race = caught.value.code() == grpc.StatusCode.INTERNAL and "execute_batch" in str(
                caught.value.debug_error_string()
            )
            if not lost_race:
                break
    assert codes[-1] == grpc.StatusCode.UNAUTHENTICATED, (codes, caught.value)
    peak = process.peak_mib()
    print(f"tokenless upload: {sent} of {chunks} MiB sent when refused; peak {peak - idle:.0f} MiB")
    assert sent < chunks // 2, sent
    assert peak - idle < MAX_GROWTH_MIB, (idle, peak)


async def test_a_batch_upload_is_stored_as_it_arrives_not_held_whole(
    setup: Setup, gateway: tuple[GatewayProcess, str]
) -> None:
    process, prefix = gateway
    token = setup.token()
    idle = await _settled_rss(process, token)
    large = [os.urandom(40 * MIB) for _ in range(4)]  # spooled, stored one by one
    small = [os.urandom(512 << 10) for _ in range(300)]  # stored in groups of 8 MiB
    items = [("sandbox-files/blake3/" + blake3.blake3(d).hexdigest(), d) for d in large + small]
    connection = GatewayConnection([process.address], lambda: token, tls=False)
    try:
        written = await RemoteBlobStore(connection).put_many(items)
    finally:
        await connection.aclose()
    assert written == [True] * len(items)
    peak = process.peak_mib()
    total = sum(len(d) for _, d in items) / MIB
    print(f"BlobPutMany of {total:.0f} MiB: idle {idle:.0f} MiB, peak {peak:.0f} MiB")
    assert peak - idle < MAX_GROWTH_MIB, (idle, peak)
    bucket = setup.s3.open(prefix)
    assert await bucket.missing([items[0][0], items[-1][0]]) == []


# ------------------------------------------------------------------ the bomb


def _zeros_frame(size: int, window_log: int = 23) -> bytes:
    """A zstd frame of ``size`` zeros (content size recorded, an 8 MiB window,
    RLE blocks), as a hostile writer makes one without compressing anything."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out.append(0xC0)  # the content size in 8 bytes; not single-segment
    out.append((window_log - 10) << 3)
    out += struct.pack("<Q", size)
    left = size
    while left:
        n = min(ZSTD_BLOCK, left)
        left -= n
        header = n << 3 | 1 << 1 | (left == 0)  # RLE block, last flag
        out += header.to_bytes(3, "little") + b"\0"
    return bytes(out)


def _zeros_digest(size: int) -> bytes:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    zeros = bytes(16 * MIB)
    for start in range(0, size, len(zeros)):
        hasher.update(zeros[: min(len(zeros), size - start)])
    return hasher.digest()


def _pack(frames: list[tuple[bytes, bytes, int]]) -> bytes:
    """A version-1 pack (rust/src/pack.rs) of ``(digest, zstd frame, raw size)``."""
    body = b"CKPK\x01\0\0\0" + b"".join(frame for _, frame, _ in frames)
    trailer = b"".join(
        digest + struct.pack("<IIBB", len(frame), raw, 1, 0) for digest, frame, raw in frames
    )
    footer = struct.pack("<II", len(trailer), len(frames)) + blake3.blake3(trailer).digest()[:8]
    return body + trailer + footer + b"\x01\0\0\0CKPK"


@pytest.fixture(scope="module")
def bomb() -> tuple[str, bytes]:
    gib = 1 << 30
    frame, digest = _zeros_frame(gib), _zeros_digest(gib)
    pack = _pack([(digest, frame, gib), (digest, frame, gib)])
    return "sandbox-packs/blake3/" + blake3.blake3(pack).hexdigest(), pack


async def _upload(process: GatewayProcess, token: str, key: str, data: bytes) -> None:
    async with _channel(process) as channel:
        stub = gpb_grpc.GatewayStub(channel)
        await stub.BlobPut(
            iter([gpb.GatewayBlobChunk(key=key, data=data, last=True, if_absent=True)]),
            metadata=bearer_metadata(token),
            timeout=120,
        )


async def test_a_pack_claiming_gigabytes_is_refused_unread_and_never_stored(
    setup: Setup, gateway: tuple[GatewayProcess, str], bomb: tuple[str, bytes]
) -> None:
    process, prefix = gateway
    key, pack = bomb
    assert 60_000 < len(pack) < 70_000, len(pack)  # the 67 KB of the report
    token = setup.token()
    idle = await _settled_rss(process, token)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _upload(process, token, key, pack)
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS, caught.value
    assert "more than a packed blob may hold" in (caught.value.details() or "")
    peak = process.peak_mib()
    print(f"67 KB bomb pack: idle {idle:.0f} MiB, peak {peak:.0f} MiB")
    assert peak - idle < MAX_GROWTH_MIB, (idle, peak)
    assert await setup.s3.open(prefix).head(key) is None


async def test_a_pack_within_raised_limits_is_checked_streaming(
    setup: Setup, bomb: tuple[str, bytes]
) -> None:
    process, prefix = setup.gateway(
        "raised", "--max-packed-blob", "1GiB", "--max-pack-decoded", "2GiB"
    )
    try:
        key, pack = bomb
        token = setup.token()
        idle = await _settled_rss(process, token)
        await _upload(process, token, key, pack)  # 2 GiB decoded and hashed
        peak = process.peak_mib()
        print(f"67 KB bomb pack within raised limits: idle {idle:.0f}, peak {peak:.0f} MiB")
        assert peak - idle < MAX_GROWTH_MIB, (idle, peak)
        assert await setup.s3.open(prefix).head(key) is not None  # valid: stored
    finally:
        process.stop()
