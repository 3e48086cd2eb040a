package checkpointd_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// Every stream the SDK opens is read to its end, so the daemon sees each call
// that succeeded complete: it logs no failure (such as "Capture failed:
// CANCELLED") for any of them.
func TestSuccessfulCallsLogNoFailure(t *testing.T) {
	d, err := startDaemon(false, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	client := d.dial(t, checkpointd.WithWorkspace(d.workspace))
	artifact, err := checkpointd.UploadArtifactBytes(ctx(t), client, "notes.txt", "text/plain",
		bytes.NewReader([]byte("notes")))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		writeTree(t, d.workspace, map[string]string{"n.txt": fmt.Sprint(i), "src/lib.txt": "lib"})
		saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{
			ThreadID: "t-quiet", Label: fmt.Sprint("step ", i), Artifacts: []*pb.Artifact{artifact}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client, checkpointd.RestoreOptions{
			ThreadID: "t-quiet", WorkspaceRoot: d.workspace, DryRun: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
		if _, err := checkpointd.GetCheckpoint(ctx(t), client, saved.Id, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := checkpointd.SweepSandboxBlobs(ctx(t), client, checkpointd.SweepOptions{DryRun: true}); err != nil {
		t.Fatal(err)
	}
	client.Close()
	d.stop() // flushes its log
	if log := d.log.String(); strings.Contains(log, "WARNING") || strings.Contains(log, "ERROR") || strings.Contains(log, " failed:") {
		t.Fatalf("the daemon logged a failure for calls that succeeded:\n%s", log)
	}
}
