"""clients/shared: the SDKs' one error vocabulary and their shared table of cases.

errors.json must list exactly the proto's ErrorReason values, each with the gRPC
status the daemon sends it with, and the gRPC status names and numbers as gRPC
spells them; cases.json may only expect codes that vocabulary defines, each with
its own status number. The SDK suites check their own codes against errors.json
(clients/typescript/test/vocabulary.test.mjs, clients/go); this test holds
errors.json to the proto and the daemon.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from checkpointd.service import status
from checkpointd.v1 import checkpointd_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / "clients" / "shared"


def _load(name: str) -> Any:
    return json.loads((SHARED / name).read_text())


@pytest.fixture(scope="module")
def vocabulary() -> Any:
    return _load("errors.json")


def test_reasons_are_the_protos_with_the_daemons_status(vocabulary: Any) -> None:
    proto_names = {name for name in pb.ErrorReason.keys() if name != "ERROR_REASON_UNSPECIFIED"}
    assert set(vocabulary["reasons"]) == proto_names
    for reason, entry in vocabulary["reasons"].items():
        assert entry["status"] == status.STATUS_BY_REASON[reason].name, reason


def test_grpc_status_names_are_spelled_as_grpc_spells_them(vocabulary: Any) -> None:
    assert vocabulary["grpcStatus"] == {code.name: code.value[0] for code in grpc.StatusCode}
    assert vocabulary["grpcStatus"]["CANCELLED"] == 1


def test_every_code_has_the_prefix_and_a_known_status(vocabulary: Any) -> None:
    prefix = vocabulary["prefix"]
    assert prefix == "SANDBOX_SNAPSHOT_"
    codes = {**vocabulary["reasons"], **vocabulary["sdkReasons"]}
    assert not set(vocabulary["sdkReasons"]) & set(vocabulary["reasons"])
    for code, entry in codes.items():
        assert code.startswith(prefix), code
        assert entry["status"] in vocabulary["grpcStatus"], code
        assert re.fullmatch(r"Sandbox(Checkpoint|Snapshot)\w*Error", entry["class"]), code
    for entry in vocabulary["sdkReasons"].values():
        assert entry["description"], "an SDK-only code has no other place that says what it means"


def test_categories_cover_distinct_statuses(vocabulary: Any) -> None:
    categories = vocabulary["categories"]
    assert set(categories) == {
        "cancelled",
        "deadline",
        "unauthenticated",
        "unavailable",
        "not_found",
        "conflict",
    }
    statuses = [name for names in categories.values() for name in names]
    assert len(statuses) == len(set(statuses)), "a status belongs to one category"
    assert set(statuses) <= set(vocabulary["grpcStatus"])


def _expected_errors(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node["error"]] if isinstance(node.get("error"), dict) else []
        return found + [e for value in node.values() for e in _expected_errors(value)]
    if isinstance(node, list):
        return [e for value in node for e in _expected_errors(value)]
    return []


def test_cases_expect_only_codes_of_the_vocabulary(vocabulary: Any) -> None:
    cases = _load("cases.json")
    assert cases["schema"] == 1
    ids = [case["id"] for case in cases["cases"]]
    assert len(ids) == len(set(ids)) and all(re.fullmatch(r"[a-z0-9-]+", i) for i in ids)
    known = {**vocabulary["reasons"], **vocabulary["sdkReasons"]}
    fallback = {vocabulary["prefix"] + name: {"status": name} for name in vocabulary["grpcStatus"]}
    errors = _expected_errors(cases["cases"])
    assert errors, "the table has error cases"
    for error in errors:
        entry = known.get(error["code"]) or fallback.get(error["code"])
        assert entry is not None, f"{error['code']} is not in errors.json"
        assert vocabulary["grpcStatus"][entry["status"]] == error["grpcCode"], error


def test_cases_use_only_the_documented_steps_and_calls() -> None:
    readme = (SHARED / "README.md").read_text()
    calls = set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.MULTILINE))
    assert {"capture", "restore", "get", "list", "head", "fork"} <= calls
    for case in _load("cases.json")["cases"]:
        for step in case["steps"]:
            kinds = {"write", "remove", "files", "call"} & set(step)
            assert len(kinds) == 1, (case["id"], step)
            if "call" in step:
                assert step["call"] in calls, (case["id"], step["call"])
                assert set(step) <= {"call", "args", "expect", "save"}, (case["id"], step)
