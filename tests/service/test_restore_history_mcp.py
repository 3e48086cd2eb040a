"""The agent's rewind through MCP (docs/restore-history.md): restore_checkpoint
stashes the agent's live changes and records the rewound tree as the head;
undo_restore brings the changes back, and undoing again is a redo."""

from __future__ import annotations

from .conftest import Daemon
from .test_mcp import agent, call, fails


async def test_a_rewind_is_undoable_and_the_head_follows(daemon: Daemon) -> None:
    root = daemon.workspace
    async with agent(daemon, "t-mcp-rewind") as client:
        await fails(client, "undo_restore", {}, "MISSING_CHECKPOINT")
        (root / "plan.md").write_text("v1\n")
        first = await call(client, "save_checkpoint", {"label": "v1"})
        (root / "plan.md").write_text("v2\n")
        await call(client, "save_checkpoint", {"label": "v2"})
        (root / "plan.md").write_text("unsaved work\n")
        (root / "draft.txt").write_text("draft\n")

        rewound = await call(client, "restore_checkpoint", {"checkpointId": first["checkpointId"]})
        assert rewound["restoredCheckpointId"] == first["checkpointId"]
        assert (root / "plan.md").read_text() == "v1\n" and not (root / "draft.txt").exists()
        saved = rewound["savedBeforeRestore"]
        assert saved is not None and saved["fileCount"] == 2
        page = await call(client, "list_checkpoints", {})
        assert page["headCheckpointId"] == rewound["headCheckpointId"]
        assert page["checkpoints"][0]["reason"] == "restore"

        undone = await call(client, "undo_restore")
        assert undone["restoredCheckpointId"] == saved["checkpointId"]
        assert (root / "plan.md").read_text() == "unsaved work\n"
        assert (root / "draft.txt").read_text() == "draft\n"
        redone = await call(client, "undo_restore")
        assert (root / "plan.md").read_text() == "v1\n" and not (root / "draft.txt").exists()
        assert redone["headCheckpointId"] != undone["headCheckpointId"]

        await fails(client, "restore_checkpoint", {"checkpointId": "nope"}, "MISSING_CHECKPOINT")
