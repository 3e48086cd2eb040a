"""Helpers the conformance suites share: a manual clock, keys, checkpoints, snapshots."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from ..errors import SandboxCheckpointError
from ..model import (
    ARTIFACT_KEY_PREFIX,
    FILE_KEY_PREFIX,
    Artifact,
    Checkpoint,
    DirEntry,
    Entry,
    FileEntry,
    SymlinkEntry,
)

START_MS = 1_000
LEASE_DURATION_MS = 100
RENEW_AFTER_MS = 25


class ManualClock:
    """A clock the test moves by hand: ``clock()`` returns ms, ``advance(ms)`` moves it."""

    def __init__(self, start: int = START_MS) -> None:
        self.ms = start

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms

    def set(self, ms: int) -> None:
        self.ms = ms


def file_key(n: int) -> str:
    return f"{FILE_KEY_PREFIX}{n:064x}"


def artifact_key(n: int) -> str:
    return f"{ARTIFACT_KEY_PREFIX}{n:064x}"


def fentry(path: str, key: int | str = 1, size: int = 3, mode: int = 0o644) -> FileEntry:
    blob_key = file_key(key) if isinstance(key, int) else key
    return FileEntry(path=path, blob_key=blob_key, size=size, mode=mode, mtime_ns=7)


def artifact(artifact_id: Any = "art-1", key: int = 1, **overrides: Any) -> Artifact:
    fields: dict[str, Any] = {
        "artifact_id": artifact_id,
        "name": "report.txt",
        "mime_type": "text/plain",
        "size": 5,
        "blob_key": artifact_key(key),
        "created_at": 1,
    }
    fields.update(overrides)
    return Artifact(**fields)


def checkpoint(
    checkpoint_id: Any,
    thread_id: Any = "t1",
    parent: Any = None,
    created_at: Any = 1,
    *,
    files: Iterable[Any] | None = None,
    **fields: Any,
) -> Checkpoint:
    """A valid checkpoint unless the arguments say otherwise (any field may be
    broken). ``fields``: the other ``Checkpoint`` fields (``artifacts`` and
    ``conversation`` taken as any iterable)."""
    entries: tuple[Entry, ...]
    if files is None:
        entries = (DirEntry("src"), fentry("src/a.txt", 1), SymlinkEntry("link", "src/a.txt"))
    else:
        entries = tuple(files)
    values: dict[str, Any] = {
        "reason": "automatic",
        "label": None,
        "source_run_id": None,
        **fields,
        "conversation": tuple(fields.get("conversation", ())),
        "artifacts": tuple(fields.get("artifacts", ())),
    }
    return Checkpoint(
        id=checkpoint_id,
        thread_id=thread_id,
        parent_checkpoint_id=parent,
        created_at=created_at,
        files=entries,
        **values,
    )


@dataclass(frozen=True)
class State:
    """What a failed write must leave unchanged."""

    heads: dict[str, str | None]
    lists: dict[str, list[Checkpoint]]
    gets: dict[str, Checkpoint | None]
    references: list[tuple[str, int]]


async def state(store: Any, threads: Iterable[str], ids: Iterable[str]) -> State:
    threads = list(threads)
    return State(
        heads={t: await store.get_head(t) for t in threads},
        lists={t: await store.list(t) for t in threads},
        gets={i: await store.get(i) for i in ids},
        references=[(r.key, r.references) for r in await store.list_blob_references()],
    )


async def close_store(store: Any) -> None:
    close = getattr(store, "aclose", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result


def expect_error(
    error: BaseException, cls: type[SandboxCheckpointError], code: str | None = None
) -> None:
    assert isinstance(error, cls), f"expected {cls.__name__}, got {type(error).__name__}: {error}"
    if code is not None:
        assert getattr(error, "code", None) == code, (
            f"expected code {code}, got {getattr(error, 'code', None)}"
        )


asyncio_test = pytest.mark.asyncio
