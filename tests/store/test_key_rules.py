"""The key and pack-index row rules every store applies (``store._options``,
``store._packindex``): the fast checks accept exactly what docs/contract.md#data-model allows."""

from __future__ import annotations

import pytest

from checkpointd.errors import SandboxCheckpointInvalidEntryError
from checkpointd.store._options import check_pin_keys, valid_blob_key
from checkpointd.store._packindex import check_packed_blobs, checked_digest
from checkpointd.store.base import PackedBlob

HEX = "0123456789abcdef" * 4
FILE = "sandbox-files/blake3/" + HEX
PACK = "sandbox-packs/blake3/" + "ab" * 32


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        (FILE, True),
        ("sandbox-artifacts/blake3/" + HEX, True),
        ("sandbox-files/blake3/" + HEX.upper(), False),
        ("sandbox-files/blake3/" + HEX[:-1], False),
        ("sandbox-files/blake3/" + HEX + "0", False),
        (FILE + "\n", False),
        ("x" + FILE, False),
        ("sandbox-packs/blake3/" + HEX, False),
        ("sandbox-files/blake3/" + HEX[:-1] + "g", False),
        (5, False),
        (None, False),
    ],
)
def test_blob_key_shapes(key: object, valid: bool) -> None:
    assert valid_blob_key(key) is valid


def test_pin_keys_names_the_bad_key() -> None:
    with pytest.raises(SandboxCheckpointInvalidEntryError, match="invalid blob key"):
        check_pin_keys([FILE, FILE + "\n"])
    assert check_pin_keys([FILE, FILE]) == [FILE]


def _row(**changes: object) -> PackedBlob:
    fields: dict[str, object] = {
        "key": FILE, "pack": PACK, "offset": 8, "length": 10, "raw_size": 20, "codec": 1,
    }  # fmt: skip
    fields.update(changes)
    return PackedBlob(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("row", "rule"),
    [
        ("not a row", "not a PackedBlob"),
        (_row(key=FILE.upper()), "is not a sandbox-files/blake3/<hex> key"),
        (_row(key=5), "is not a sandbox-files/blake3/<hex> key"),
        (_row(pack=PACK + "0"), "is not a sandbox-packs/blake3/<hex> key"),
        (_row(pack=["unhashable"]), "is not a sandbox-packs/blake3/<hex> key"),
        (_row(offset=True), "must be ints"),
        (_row(codec=1.0), "must be ints"),
        (_row(offset=7), "out of range"),
        (_row(length=-1), "out of range"),
        (_row(raw_size=1 << 31), "out of range"),
        (_row(codec=2), "out of range"),
    ],
)
def test_bad_pack_row_is_refused_naming_the_rule(row: object, rule: str) -> None:
    with pytest.raises(SandboxCheckpointInvalidEntryError, match="invalid pack index row") as info:
        check_packed_blobs([_row(), row], None)  # type: ignore[list-item]
    assert rule in str(info.value)


def test_pack_rows_kept_once_per_referenced_key_in_key_order() -> None:
    other = "sandbox-files/blake3/" + "f" * 64
    unreferenced = "sandbox-files/blake3/" + "e" * 64
    rows = [_row(key=other), _row(), _row(key=unreferenced), _row(offset=40)]
    referenced = {checked_digest(FILE), checked_digest(other)}
    kept = check_packed_blobs(rows, lambda key: checked_digest(key) in referenced)
    assert [row.key for row in kept] == [FILE, other]
    assert kept[0].offset == 40  # the newest row of a key wins
