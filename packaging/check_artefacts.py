"""Checks the image artefacts that `make wheel` and `make binary` build, and reports them.

    python packaging/check_artefacts.py wheels DIST_DIR manylinux2014 musllinux_1_2
    python packaging/check_artefacts.py binary DIST_DIR/checkpointd

wheels: `auditwheel show` must find each wheel consistent with the tag its name
claims (manylinux2014 is manylinux_2_17), and every native module in it stripped
(no .symtab). binary: prints its size and the newest glibc symbol version any ELF
file inside it needs: the oldest glibc it runs on. Both print one line per artefact
and exit 1 naming the artefact and the rule it breaks.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

# The tag auditwheel reports for each `make wheel` tag (PEP 600 names manylinux2014).
AUDITWHEEL_TAG = {
    "manylinux2014": "manylinux_2_17_x86_64",
    "musllinux_1_2": "musllinux_1_2_x86_64",
}


class ArtefactError(Exception):
    """An artefact breaks a rule: the message names both."""


def _megabytes(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"


def _is_stripped(elf_bytes: bytes) -> bool:
    with tempfile.TemporaryFile() as handle:
        handle.write(elf_bytes)
        handle.seek(0)
        return ELFFile(handle).get_section_by_name(".symtab") is None


def glibc_floor(elf: ELFFile) -> tuple[int, ...]:
    """The newest GLIBC_x.y version the ELF file needs, (0,) when it needs none."""
    newest: tuple[int, ...] = (0,)
    for section in elf.iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _needed, versions in section.iter_versions():
            for version in versions:
                match = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", version.name)
                if match:
                    newest = max(newest, tuple(int(p) for p in match.group(1).split(".")))
    return newest


def check_wheel(wheel: Path, tag: str) -> str:
    """Checks one wheel; returns the platform tag auditwheel confirmed."""
    expected = AUDITWHEEL_TAG[tag]
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("auditwheel")), "show", "--json", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        raise ArtefactError(f"{wheel}: auditwheel show failed: {shown.stderr.strip()}")
    report = json.loads(shown.stdout)
    if report["overall_tag"] != expected:
        raise ArtefactError(
            f"{wheel}: auditwheel finds it consistent with {report['overall_tag']}, "
            f"not {expected} (external libraries: {report.get('external_libs')})"
        )
    with zipfile.ZipFile(wheel) as archive:
        modules = [name for name in archive.namelist() if name.endswith(".so")]
        if not modules:
            raise ArtefactError(f"{wheel}: holds no native module")
        for name in modules:
            if not _is_stripped(archive.read(name)):
                raise ArtefactError(f"{wheel}: {name} is not stripped (it has a .symtab)")
    return expected


def check_wheels(dist: Path, tags: list[str]) -> None:
    for tag in tags:
        if tag not in AUDITWHEEL_TAG:
            raise ArtefactError(f"unknown wheel tag {tag} (known: {', '.join(AUDITWHEEL_TAG)})")
        pattern = f"checkpointd-*-{tag}_x86_64*.whl"
        found = sorted(dist.glob(pattern))
        if len(found) != 1:
            raise ArtefactError(f"{dist}: expected one wheel {pattern}, found {len(found)}")
        confirmed = check_wheel(found[0], tag)
        print(
            f"wheel {found[0].name}: auditwheel tag {confirmed}, native module stripped, "
            f"{_megabytes(found[0].stat().st_size)}"
        )


def _bundled_elf_files(binary: Path, scratch: Path) -> list[Path]:
    """Extracts the binary's bundled shared objects (PyInstaller's CArchive)."""
    from PyInstaller.archive.readers import CArchiveReader

    reader = CArchiveReader(str(binary))
    extracted: list[Path] = []
    for name in reader.toc:
        data = reader.extract(name)
        if not data or not data.startswith(b"\x7fELF"):
            continue
        target = scratch / str(len(extracted))
        target.write_bytes(data)
        extracted.append(target)
    return extracted


def check_binary(binary: Path) -> None:
    if not binary.is_file():
        raise ArtefactError(f"{binary}: no such binary (make binary builds it)")
    with tempfile.TemporaryDirectory() as scratch:
        elf_files = [binary, *_bundled_elf_files(binary, Path(scratch))]
        floors = []
        for path in elf_files:
            with path.open("rb") as handle:
                floors.append(glibc_floor(ELFFile(handle)))
    floor = ".".join(str(p) for p in max(floors))
    print(
        f"binary {binary.name}: {_megabytes(binary.stat().st_size)}, "
        f"{len(elf_files)} ELF files, needs glibc >= {floor}"
    )


def main(argv: list[str]) -> int:
    try:
        if len(argv) >= 2 and argv[0] == "wheels":
            check_wheels(Path(argv[1]), argv[2:] or list(AUDITWHEEL_TAG))
        elif len(argv) == 2 and argv[0] == "binary":
            check_binary(Path(argv[1]))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except ArtefactError as error:
        print(f"check_artefacts: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
