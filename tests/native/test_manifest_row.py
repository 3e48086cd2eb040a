"""Finding one path's row in a manifest's bytes (``_native.manifest_row``):
what ReadFile uses instead of decoding every entry."""

from __future__ import annotations

from pathlib import Path

from checkpointd import _native
from checkpointd.codec import decode_entries, encode_entries
from checkpointd.model import FILE_KEY_PREFIX, DirEntry, FileEntry
from checkpointd.scanner import scan_workspace

# Names whose byte order differs from their order as characters, as JSON
# (escapes) or as path components ('/' sorts after ' ', '-' and '.').
NAMES = ["a", "a b", "a-b", "a.b", "a/b", "a/b/c", "a0", 'q"uote', "é", "z\u2028"]


def _tree(root: Path) -> None:
    for name in NAMES:
        path = root / name
        if name in ("a", "a/b"):
            path.mkdir(exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


def test_every_row_of_a_scanned_manifest_is_found_and_no_other(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    _tree(root)
    manifest = scan_workspace(root, None, (), None).manifest
    entries = decode_entries(manifest)
    assert len(entries) == len(NAMES)
    for entry in entries:
        row = _native.manifest_row(manifest, entry.path)
        assert row is not None and decode_entries(b"[" + row + b"]") == (entry,)
    for missing in ["", "a/", "a/b/c/d", "a b ", "0", "zz", "a/b/", "é/x"]:
        assert _native.manifest_row(manifest, missing) is None, missing
    assert _native.manifest_row(b"[]", "a") is None


def test_rows_out_of_order_may_be_missed_but_never_mistaken() -> None:
    entries = (
        FileEntry("b", FILE_KEY_PREFIX + "1" * 64, 1),
        DirEntry("a"),
        FileEntry("c", FILE_KEY_PREFIX + "2" * 64, 2),
    )
    data = encode_entries(entries)
    for entry in entries:
        row = _native.manifest_row(data, entry.path)
        assert row is None or decode_entries(b"[" + row + b"]") == (entry,)
