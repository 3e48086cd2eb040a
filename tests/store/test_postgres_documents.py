"""The PostgreSQL store's stored documents: keyframes and deltas round-trip exactly.

Pure functions, no server: a delta against any base, materialized again, gives the
same checkpoint; chains of deltas too; and a delta is only used while it is small.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from checkpointd.model import Checkpoint, DirEntry, FileEntry, SymlinkEntry
from checkpointd.store import _documents as documents


def file_key(n: int) -> str:
    return f"sandbox-files/blake3/{n:064x}"


entries = st.lists(
    st.tuples(st.sampled_from("fdl"), st.integers(0, 40), st.integers(0, 3)),
    max_size=30,
    unique_by=lambda t: t[1],
)
messages = st.lists(
    st.one_of(
        st.integers(0, 3),
        st.text(max_size=3),
        st.dictionaries(st.text(max_size=2), st.integers(0, 2)),
    ),
    max_size=8,
)


def make(checkpoint_id: str, spec: list[tuple[str, int, int]], conversation: list) -> Checkpoint:
    files = []
    for kind, n, variant in spec:
        path = f"p{n:03d}"
        if kind == "f":
            files.append(FileEntry(path, file_key(n * 10 + variant), variant))
        elif kind == "d":
            files.append(DirEntry(path, 0o700 + variant))
        else:
            files.append(SymlinkEntry(path, f"t{variant}"))
    return Checkpoint(
        id=checkpoint_id,
        thread_id="t",
        parent_checkpoint_id=None,
        created_at=1,
        files=tuple(files),
        conversation=tuple(conversation),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(entries, messages), min_size=1, max_size=6))
def test_chains_of_deltas_materialize_to_the_same_checkpoints(
    versions: list[tuple[list, list]],
) -> None:
    rows: dict[str, tuple[str | None, bytes]] = {}
    made: dict[str, Checkpoint] = {}
    base_id: str | None = None
    base: documents.Content | None = None
    depth = 0
    for n, (spec, conversation) in enumerate(versions):
        checkpoint = make(f"c{n}", spec, conversation)
        content = documents.Content.of(checkpoint)
        stored = documents.encode(content, base_id, base, depth)
        assert stored.base_id in (None, base_id)
        rows[checkpoint.id] = (stored.base_id, stored.data)
        made[checkpoint.id] = checkpoint
        base_id, base, depth = checkpoint.id, content, stored.depth
    memo: dict[str, documents.Content] = {}
    for checkpoint_id, checkpoint in made.items():
        assert documents.materialize(checkpoint_id, rows, memo).checkpoint() == checkpoint
        # A cold read (no memo) agrees.
        assert documents.materialize(checkpoint_id, rows, {}).checkpoint() == checkpoint


def test_small_changes_are_deltas_and_big_ones_keyframes() -> None:
    # 200 entries: every row also carries its manifest's summary (~60 bytes
    # compressed), a fixed cost that a 100-entry keyframe is too small to dwarf.
    spec = [("f", n, 0) for n in range(200)]
    first = documents.Content.of(make("a", spec, []))
    small = documents.Content.of(make("b", [("f", 0, 1), *spec[1:]], [{"m": 1}]))
    stored = documents.encode(small, "a", first, 0)
    assert (stored.base_id, stored.depth) == ("a", 1)
    assert len(stored.data) * 3 < len(documents.keyframe(small).data)
    big = documents.Content.of(make("c", [("f", n, 1) for n in range(200)], []))
    assert documents.encode(big, "a", first, 0).base_id is None
    too_deep = documents.encode(small, "a", first, documents.MAX_DEPTH)
    assert (too_deep.base_id, too_deep.depth) == (None, 0)


def test_content_shares_nothing_mutable_with_the_caller() -> None:
    conversation = [{"role": "user", "content": ["a"]}]
    checkpoint = make("a", [("f", 1, 0)], conversation)
    content = documents.Content.of(checkpoint)
    conversation[0]["content"].append("changed later")  # the caller's own objects
    assert content.checkpoint().conversation == ({"role": "user", "content": ["a"]},)
    returned = content.checkpoint()
    returned.conversation[0]["role"] = "mutated"
    assert content.checkpoint().conversation[0]["role"] == "user"
