"""packaging/check_artefacts.py, the check `make wheel` and `make binary` end with."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import REPO


def _load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "checkpointd_check_artefacts", REPO / "packaging" / "check_artefacts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = _load_check()


def test_the_built_wheels_have_their_tags(wheel: Path, musl_wheel: Path) -> None:
    assert check.check_wheel(wheel, "manylinux2014") == "manylinux_2_17_x86_64"
    assert check.check_wheel(musl_wheel, "musllinux_1_2") == "musllinux_1_2_x86_64"


def test_a_wheel_claiming_the_wrong_tag_is_refused(wheel: Path, tmp_path: Path) -> None:
    liar = tmp_path / wheel.name.replace(
        "manylinux2014_x86_64.manylinux_2_17_x86_64", "musllinux_1_2_x86_64"
    )
    shutil.copyfile(wheel, liar)
    with pytest.raises(check.ArtefactError, match=r"auditwheel (show failed|finds it consistent)"):
        check.check_wheel(liar, "musllinux_1_2")


def test_an_unstripped_native_module_is_refused(wheel: Path, tmp_path: Path) -> None:
    # The same wheel with its module's symbol table put back: objcopy adds a .symtab.
    unstripped = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(unstripped, "w") as out:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith(".so"):
                data = _with_symtab(data, tmp_path)
            out.writestr(item, data)
    with pytest.raises(check.ArtefactError, match="is not stripped"):
        check.check_wheel(unstripped, "manylinux2014")


def _with_symtab(elf: bytes, scratch: Path) -> bytes:
    path = scratch / "module.so"
    path.write_bytes(elf)
    # A local symbol makes objcopy write a symbol table; the code is unchanged.
    subprocess.run(
        ["objcopy", "--add-symbol", "checkpointd_test=.text:0,local", str(path)], check=True
    )
    return path.read_bytes()
