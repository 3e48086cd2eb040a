package checkpointd_test

import (
	"path/filepath"
	"slices"
	"testing"

	"checkpointd.dev/clients/go/checkpointd"
)

// A restore saves the live changes it overwrites to the thread's stash;
// UndoRestore brings them back; Record moves the head.
func TestRestoreStashesLiveChangesAndUndoBringsThemBack(t *testing.T) {
	client := unixDaemon.dial(t, checkpointd.WithWorkspace(unixDaemon.workspace))
	root := filepath.Join(unixDaemon.workspace, "history")
	writeTree(t, root, map[string]string{"a.txt": "v1"})
	first, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client,
		checkpointd.CaptureOptions{ThreadID: "t-history", WorkspaceRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpointd.UndoRestore(ctx(t), client, checkpointd.UndoOptions{ThreadID: "t-history"}); !checkpointd.IsNotFound(err) {
		t.Fatalf("undo with an empty stash: %v", err)
	}
	writeTree(t, root, map[string]string{"a.txt": "v2, not captured"})

	plan, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-history", WorkspaceRoot: root, DryRun: true})
	if err != nil || !slices.Equal(plan.Plan.Stashed, []string{"a.txt"}) || plan.Plan.GetPathsStashed() != 1 {
		t.Fatalf("plan %+v %v", plan, err)
	}
	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-history", WorkspaceRoot: root})
	if err != nil || restored.Id != first.Id || restored.SavedBeforeRestore == nil || restored.Recorded != nil {
		t.Fatalf("restore %+v %v", restored, err)
	}
	if read(t, filepath.Join(root, "a.txt")) != "v1" {
		t.Fatal("not restored")
	}
	var stash []string
	for c, err := range checkpointd.ListCheckpoints(ctx(t), client, checkpointd.ListOptions{ThreadID: "t-history", Stash: true}) {
		if err != nil {
			t.Fatal(err)
		}
		stash = append(stash, c.Id)
	}
	if len(stash) != 1 || stash[0] != restored.SavedBeforeRestore.GetCheckpoint().GetId() {
		t.Fatalf("stash %v", stash)
	}

	undone, err := checkpointd.UndoRestore(ctx(t), client, checkpointd.UndoOptions{ThreadID: "t-history", WorkspaceRoot: root})
	if err != nil || undone.Id != stash[0] {
		t.Fatalf("undo %+v %v", undone, err)
	}
	if read(t, filepath.Join(root, "a.txt")) != "v2, not captured" {
		t.Fatal("the live change is not back")
	}

	// Record: the head follows the restore of an older checkpoint.
	writeTree(t, root, map[string]string{"a.txt": "v3"})
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client,
		checkpointd.CaptureOptions{ThreadID: "t-history", WorkspaceRoot: root}); err != nil {
		t.Fatal(err)
	}
	recorded, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client, checkpointd.RestoreOptions{
		ThreadID: "t-history", WorkspaceRoot: root, CheckpointID: first.Id, Record: true, DiscardLiveChanges: true})
	if err != nil || recorded.Recorded == nil || recorded.Recorded.GetRestoredFromCheckpointId() != first.Id ||
		recorded.SavedBeforeRestore != nil {
		t.Fatalf("record %+v %v", recorded, err)
	}
	if head, err := checkpointd.GetHead(ctx(t), client, "t-history"); err != nil || head != recorded.Recorded.Id {
		t.Fatalf("head %s %v", head, err)
	}
}
