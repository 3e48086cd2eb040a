package checkpointd_test

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"checkpointd.dev/clients/go/checkpointd"
)

func TestRestoreFillsSecretsByNameAndReportsTheUnfilled(t *testing.T) {
	client := unixDaemon.dial(t, checkpointd.WithWorkspace(unixDaemon.workspace))
	root := filepath.Join(unixDaemon.workspace, "secrets")
	files := map[string]string{"a.env": "A=alpha-secret\n", "b.env": "B=beta-secret\n", "plain.txt": "no secret"}
	writeTree(t, root, files)
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{
		ThreadID: "t-secrets", WorkspaceRoot: root,
		Secrets: [][]byte{[]byte("alpha-secret"), []byte("beta-secret")}, SecretNames: []string{"A", "B"}}); err != nil {
		t.Fatal(err)
	}

	// Without the secrets, and required: the files are restored (zeros where
	// the secrets were) and the error says which, with the result beside it.
	writeTree(t, root, map[string]string{"a.env": "lost", "b.env": "lost"})
	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client, checkpointd.RestoreOptions{
		ThreadID: "t-secrets", WorkspaceRoot: root, RequireSecrets: true})
	var snapshot checkpointd.SnapshotError
	if !errors.As(err, &snapshot) || snapshot.Code != checkpointd.CodeUnfilledSecrets ||
		status.Code(err) != codes.FailedPrecondition || snapshot.Metadata["unfilled_secret_count"] != "2" ||
		snapshot.Metadata["checkpoint_id"] != restored.GetId() {
		t.Fatalf("required secrets: %v", err)
	}
	if restored.UnfilledSecretCount != 2 || !slices.Equal(restored.UnfilledSecretPaths, []string{"secrets/a.env", "secrets/b.env"}) {
		t.Fatalf("restored %+v", restored)
	}
	if got := read(t, filepath.Join(root, "a.env")); got != "A=\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\n" {
		t.Fatalf("a.env %q", got)
	}

	// By name, in another order: both written back.
	restored, err = checkpointd.RestoreSandboxCheckpoint(ctx(t), client, checkpointd.RestoreOptions{
		ThreadID: "t-secrets", WorkspaceRoot: root, RequireSecrets: true,
		Secrets: [][]byte{[]byte("beta-secret"), []byte("alpha-secret")}, SecretNames: []string{"B", "A"}})
	if err != nil || restored.UnfilledSecretCount != 0 || len(restored.UnfilledSecretPaths) != 0 {
		t.Fatalf("with the secrets: %+v %v", restored, err)
	}
	for rel, content := range files {
		if got := read(t, filepath.Join(root, rel)); got != content {
			t.Fatalf("%s: %q", rel, got)
		}
	}
}

func TestRestoreArgumentsAreCheckedBeforeAnyCall(t *testing.T) {
	client := unixDaemon.dial(t, checkpointd.WithWorkspace(unixDaemon.workspace))
	for name, o := range map[string]checkpointd.RestoreOptions{
		"names without their secrets": {ThreadID: "t-args", Secrets: [][]byte{[]byte("abcd")}, SecretNames: []string{"A", "B"}},
		"root and subdir":             {ThreadID: "t-args", WorkspaceRoot: unixDaemon.workspace, WorkspaceSubdir: "x"},
	} {
		_, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client, o)
		var e checkpointd.InvalidArgumentError
		if !errors.As(err, &e) || e.GRPCCode != codes.InvalidArgument || status.Code(err) != codes.InvalidArgument ||
			e.Metadata["field"] == "" {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// A relative WorkspaceRoot is a path error, as one outside the workspace.
	_, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{ThreadID: "t-args", WorkspaceRoot: "rel"})
	var snapshot checkpointd.SnapshotError
	if !errors.As(err, &snapshot) || snapshot.Code != checkpointd.CodeInvalidPath || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("relative root: %v", err)
	}
	// A dry run of a thread with no checkpoint plans nothing.
	if plan, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-args-none", DryRun: true}); plan != nil || err != nil {
		t.Fatalf("dry run of a new thread: %v %v", plan, err)
	}
}
