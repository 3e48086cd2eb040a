"""Checkpoint references on the command line.

Wherever a command takes a checkpoint it takes one of:

* a checkpoint id;
* a unique part of one, at least MIN_PART characters: the start of the id or
  of its last group, or its end (ids are UUIDv7s, ordered by time, so
  checkpoints made close together share their first characters; the last
  group is random). Every thread's checkpoints are searched; an ambiguous
  part is refused (exit 2) with the candidates listed;
* ``THREAD:head``, ``THREAD:head~N`` (the head's N-th ancestor on its chain),
  ``THREAD:LABEL`` (the newest checkpoint of the thread with that label) or
  ``THREAD:PART`` (a part of an id of that thread). The first colon separates
  the thread.

A command that already names the thread (``restore THREAD --checkpoint``,
``fork THREAD CHECKPOINT``, ``list THREAD --before``, ``diff --thread``) also
takes the part after the colon alone: ``head~2``, a label, a part of an id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import grpc

from .cli_output import UsageError, human_time, table
from .service.client import Client, RpcError

MIN_PART = 4
# Candidates listed when a reference is ambiguous.
MAX_CANDIDATES = 10
_HEAD = re.compile(r"head(?:~(\d+))?")
_MISSING = "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"
# Answers that mean "no checkpoint has exactly this id".
_NOT_AN_ID = ("SANDBOX_SNAPSHOT_INVALID_ID", _MISSING)


@dataclass(frozen=True)
class Candidate:
    id: str
    thread_id: str
    created_at: int
    label: str | None


class AmbiguousReference(UsageError):
    """A reference that more than one checkpoint answers to (exit code 2)."""


def _not_found(message: str, **metadata: str) -> RpcError:
    return RpcError(grpc.StatusCode.NOT_FOUND, message, _MISSING, dict(metadata))


def _candidate(summary: Any) -> Candidate:
    label = summary.label if summary.HasField("label") else None
    return Candidate(summary.id, summary.thread_id, summary.created_at, label)


def _ambiguous(reference: str, found: list[Candidate], why: str) -> AmbiguousReference:
    found = sorted(found, key=lambda c: (-c.created_at, c.id))
    rows = [
        [c.id, f"thread {c.thread_id}", human_time(c.created_at), c.label or ""]
        for c in found[:MAX_CANDIDATES]
    ]
    more = len(found) - len(rows)
    text = "\n".join("  " + line for line in table(rows).splitlines())
    return AmbiguousReference(
        f"{reference!r} is ambiguous: {why} {len(found)} checkpoints; give more characters "
        "or the full id:\n" + text + (f"\n  … {more} more" if more > 0 else "")
    )


def matches_part(checkpoint_id: str, part: str) -> bool:
    """True when ``part`` begins the id or its last group, or ends the id."""
    last_group = checkpoint_id.rsplit("-", 1)[-1]
    return (
        checkpoint_id.startswith(part)
        or last_group.startswith(part)
        or checkpoint_id.endswith(part)
    )


def _check_part(reference: str, part: str) -> None:
    if len(part) < MIN_PART:
        raise UsageError(
            f"{reference!r} is not a checkpoint id; a part of one needs at least {MIN_PART} "
            "characters (or say THREAD:head, THREAD:head~N, THREAD:LABEL)"
        )


async def _exact(client: Client, reference: str) -> Any | None:
    """The checkpoint whose id is exactly ``reference``, else None."""
    try:
        return (await client.get_checkpoint(reference)).checkpoint
    except RpcError as error:
        if error.reason in _NOT_AN_ID:
            return None
        raise


async def resolve(client: Client, reference: str, *, thread: str | None = None) -> str:
    """The checkpoint id ``reference`` names (see the module's docstring);
    ``thread``: the thread the command already names. Raises UsageError (a
    part too short, a thread that contradicts the command's),
    AmbiguousReference, or RpcError NOT_FOUND (nothing matches)."""
    if not reference:
        raise UsageError("an empty checkpoint reference")
    exact = await _exact(client, reference)
    if exact is not None:
        return reference
    named, colon, rest = reference.partition(":")
    if colon:
        if thread is not None and named != thread:
            raise UsageError(
                f"{reference!r} names thread {named!r}, but the command is about thread {thread!r}"
            )
        if not named or not rest:
            raise UsageError(f"{reference!r}: say THREAD:head, THREAD:head~N or THREAD:LABEL")
        return await _in_thread(client, named, rest, reference)
    if thread is not None:
        return await _in_thread(client, thread, reference, reference)
    if _HEAD.fullmatch(reference):
        raise UsageError(f"{reference!r}: which thread's? Say THREAD:{reference}")
    return await _by_part(client, reference)


async def _in_thread(client: Client, thread: str, rest: str, reference: str) -> str:
    head_match = _HEAD.fullmatch(rest)
    summaries = await client.list_checkpoints(thread)
    if head_match is not None:
        return await _ancestor(client, thread, int(head_match.group(1) or 0), summaries)
    labelled = [s for s in summaries if s.HasField("label") and s.label == rest]
    by_label = max(labelled, key=lambda s: (s.created_at, s.id)) if labelled else None
    by_part = [s for s in summaries if len(rest) >= MIN_PART and matches_part(s.id, rest)]
    found = {s.id: s for s in ([by_label] if by_label else []) + by_part}
    if len(found) == 1:
        return next(iter(found))
    if found:
        why = "a label and a part of an id" if by_label else "it begins the ids of"
        raise _ambiguous(reference, [_candidate(s) for s in found.values()], why)
    raise _not_found(
        f"no checkpoint of thread {thread} has the label {rest!r}"
        + (f" or an id beginning with {rest!r}" if len(rest) >= MIN_PART else ""),
        thread_id=thread,
        reference=reference,
    )


async def _ancestor(client: Client, thread: str, steps: int, summaries: list[Any]) -> str:
    """The head's ``steps``-th ancestor on its chain (0: the head)."""
    head = await client.get_head(thread)
    if head is None:
        raise _not_found(f"thread {thread} has no head (no checkpoints)", thread_id=thread)
    parents = {
        s.id: (s.parent_checkpoint_id if s.HasField("parent_checkpoint_id") else None)
        for s in summaries
    }
    current: str | None = head
    for taken in range(steps):
        parent = parents.get(current) if current is not None else None
        if parent is None or parent not in parents:
            raise _not_found(
                f"thread {thread}'s head has {taken} ancestors on its chain, not {steps}",
                thread_id=thread,
                head_checkpoint_id=head,
            )
        current = parent
    assert current is not None
    return current


async def _by_part(client: Client, part: str) -> str:
    """The one checkpoint, of any thread, whose id or last group ``part`` begins."""
    _check_part(part, part)
    found: list[Candidate] = []
    async for thread in client.list_threads():
        summaries = await client.list_checkpoints(thread.thread_id)
        found += [_candidate(s) for s in summaries if matches_part(s.id, part)]
    if len(found) == 1:
        return found[0].id
    if found:
        raise _ambiguous(part, found, "it begins the ids of")
    raise _not_found(
        f"no checkpoint id begins or ends with {part!r} (nor does its last group begin "
        "with it); a label needs its thread: THREAD:LABEL",
        reference=part,
    )
