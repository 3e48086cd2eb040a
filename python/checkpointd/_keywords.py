"""Keyword arguments declared as ``**options: Unpack[SomeTypedDict]``.

A public function with many keyword options takes them that way: its callers
write the same keywords as ever, mypy checks each against the TypedDict, and
the signature stays short. At run time Python checks nothing for such a
``**options``, so ``check_keywords`` raises the TypeError an explicit signature
would: a misspelt option (``dryrun=True`` to a sweep) fails instead of being
ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def check_keywords(function: str, given: Mapping[str, object], accepted: type[Any]) -> None:
    """Raise TypeError, as Python does for an explicit signature, when ``given``
    holds a keyword the TypedDict ``accepted`` does not declare or lacks one it
    requires; ``function`` names the callee in the message."""
    required: frozenset[str] = accepted.__required_keys__
    unexpected = sorted(given.keys() - required - accepted.__optional_keys__)
    if unexpected:
        raise TypeError(f"{function}() got an unexpected keyword argument {unexpected[0]!r}")
    missing = sorted(required - given.keys())
    if missing:
        raise TypeError(f"{function}() missing required keyword-only argument: {missing[0]!r}")


__all__ = ["check_keywords"]
