"""The typed contract (_native.pyi) and the compiled module list the same names."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

from checkpointd import _native

STUB = Path(_native.__file__).with_name("_native.pyi")


def _parse(source: str) -> ast.Module:
    # CPython 3.11.7 keeps the AST constructor's recursion counter in state
    # shared by the interpreter's threads, and a garbage collection during the
    # conversion runs finalizers, which may let another thread's parse move it:
    # SystemError "AST constructor recursion depth mismatch" (python/cpython
    # gh-106905), seen once after the whole engine suite had left threads
    # behind. With collection paused, nothing else runs during the parse.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def stub_names() -> dict[str, set[str]]:
    """Top-level names of the stub → the public member names of each class."""
    names: dict[str, set[str]] = {}
    for node in _parse(STUB.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            members: set[str] = set()
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
            names[node.name] = members
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return names


def test_every_stub_name_exists_in_the_module() -> None:
    for name, members in stub_names().items():
        assert hasattr(_native, name), name
        value = getattr(_native, name)
        for member in members:
            assert hasattr(value, member), f"{name}.{member}"


def test_every_public_module_name_is_in_the_stub() -> None:
    public = {name for name in dir(_native) if not name.startswith("_")}
    assert public <= set(stub_names()), public - set(stub_names())
