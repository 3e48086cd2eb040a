package checkpointd_test

// The examples of TanStack AI's "Checkpoint at Any Time" and "Store
// Checkpoints" pages, in Go. Each dials "" (CHECKPOINTD_ADDRESS) and writes
// below CHECKPOINTD_WORKSPACE, the daemon's workspace.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// startWorkspace restores the newest checkpoint before the agent runs, so that
// nothing else writes to the workspace during the restore.
func startWorkspace(ctx context.Context, client *checkpointd.Client, root, threadID string) error {
	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx, client,
		checkpointd.RestoreOptions{ThreadID: threadID, WorkspaceRoot: root})
	if err != nil {
		return err
	}
	// nil: the thread has no checkpoint yet, so the workspace stays as it is.
	if restored == nil {
		fmt.Println("New thread")
	} else {
		fmt.Println("Restored a checkpoint,", restored.GetReason())
	}
	return nil
}

// checkpoint saves the workspace; "" when another capture of the thread runs
// (skip it: the next one saves the same files).
func checkpoint(ctx context.Context, client *checkpointd.Client, root, threadID, label string) (string, error) {
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client,
		checkpointd.CaptureOptions{ThreadID: threadID, WorkspaceRoot: root, Label: label})
	if errors.As(err, &checkpointd.WriterConflictError{}) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return saved.Id, nil
}

// checkpointEvery saves the workspace every interval until stop is called.
func checkpointEvery(client *checkpointd.Client, root, threadID string, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ticker := time.NewTicker(interval)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				if _, err := checkpoint(ctx, client, root, threadID, ""); err != nil && ctx.Err() == nil {
					log.Print(err)
				}
			}
		}
	}()
	return func() { ticker.Stop(); cancel(); <-done }
}

// Add checkpoints to an agent loop: restore first, save between steps, and
// after a crash a new sandbox gets the files back.
func Example_checkpointAtAnyTime() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "agent")
	if err := os.MkdirAll(root, 0o755); err != nil {
		log.Fatal(err)
	}

	if err := startWorkspace(ctx, client, root, "example-agent"); err != nil {
		log.Fatal(err)
	}
	// The agent writes a file and finishes a step.
	if err := os.WriteFile(filepath.Join(root, "notes.md"), []byte("step 1\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	if _, err := checkpoint(ctx, client, root, "example-agent", "step 1"); err != nil {
		log.Fatal(err)
	}
	// Or save in the background while it works.
	stop := checkpointEvery(client, root, "example-agent", 20*time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if head, _ := checkpointd.GetHead(ctx, client, "example-agent"); head != "" {
			if c, _ := checkpointd.GetCheckpoint(ctx, client, head, false); c != nil && c.GetReason() == "automatic" {
				break
			}
		}
	}
	stop()

	// The sandbox crashes; a new one starts empty.
	if err := os.RemoveAll(root); err != nil {
		log.Fatal(err)
	}
	if err := startWorkspace(ctx, client, root, "example-agent"); err != nil {
		log.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(root, "notes.md"))
	fmt.Printf("%q %v\n", notes, err)
	// Output:
	// New thread
	// Restored a checkpoint, automatic
	// "step 1\n" <nil>
}

// The capture options: a label names the checkpoint, a policy picks the files,
// secrets are stored as zeros, the conversation is kept beside the files.
func ExampleCaptureSandboxCheckpoint() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "options")
	writeFiles(root, map[string]string{"config.txt": "API_KEY=sk-live-1234\n", "build/out.bin": "generated",
		"app.py": "print('hi')\n"})

	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client, checkpointd.CaptureOptions{
		ThreadID:      "example-options",
		WorkspaceRoot: root,
		Label:         "before refactor",
		Policy:        &pb.Policy{Exclude: []string{"build/"}},
		Secrets:       [][]byte{[]byte("sk-live-1234")},
		SecretNames:   []string{"API_KEY"},
		Conversation:  []any{map[string]string{"role": "user", "content": "refactor app.py"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(saved.GetReason(), saved.GetLabel(), saved.GetFileCount(), saved.GetConversationCount())

	// The checkpoint holds zeros where the secret was; a restore given the
	// secret writes it back.
	stream, err := client.ReadFile(ctx, &pb.ReadFileRequest{CheckpointId: saved.Id, Path: "config.txt"})
	if err != nil {
		log.Fatal(err)
	}
	var stored []byte
	for chunk, err := stream.Recv(); err != io.EOF; chunk, err = stream.Recv() {
		if err != nil {
			log.Fatal(err)
		}
		stored = append(stored, chunk.GetData()...)
	}
	fmt.Printf("%q\n", stored)
	// Output:
	// named before refactor 2 1
	// "API_KEY=\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\n"
}

// Restore rules: an older checkpoint by id; files the checkpoint lacks are
// removed, paths the policy excludes stay; an id not on the thread is a
// SnapshotError with code SANDBOX_SNAPSHOT_MISSING_CHECKPOINT.
func ExampleRestoreSandboxCheckpoint() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "rules")
	policy := &pb.Policy{Exclude: []string{"cache/"}}
	writeFiles(root, map[string]string{"a.txt": "v1"})
	first, err := checkpointd.CaptureSandboxCheckpoint(ctx, client,
		checkpointd.CaptureOptions{ThreadID: "example-rules", WorkspaceRoot: root, Policy: policy})
	if err != nil {
		log.Fatal(err)
	}
	writeFiles(root, map[string]string{"a.txt": "v2", "b.txt": "new", "cache/x": "kept"})
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx, client,
		checkpointd.CaptureOptions{ThreadID: "example-rules", WorkspaceRoot: root, Policy: policy}); err != nil {
		log.Fatal(err)
	}

	// What restoring the first checkpoint would do, then do it.
	plan, err := checkpointd.RestoreSandboxCheckpoint(ctx, client, checkpointd.RestoreOptions{
		ThreadID: "example-rules", WorkspaceRoot: root, CheckpointID: first.Id, DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("would write", plan.Plan.Written, "and delete", plan.Plan.Deleted)
	if _, err := checkpointd.RestoreSandboxCheckpoint(ctx, client, checkpointd.RestoreOptions{
		ThreadID: "example-rules", WorkspaceRoot: root, CheckpointID: first.Id}); err != nil {
		log.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(root, "a.txt"))
	_, bErr := os.Stat(filepath.Join(root, "b.txt"))
	cache, _ := os.ReadFile(filepath.Join(root, "cache/x"))
	fmt.Printf("a.txt %s, b.txt removed %v, cache/x %s\n", a, errors.Is(bErr, os.ErrNotExist), cache)

	_, err = checkpointd.RestoreSandboxCheckpoint(ctx, client, checkpointd.RestoreOptions{
		ThreadID: "example-rules", WorkspaceRoot: root, CheckpointID: "no-such-checkpoint"})
	var snapshot checkpointd.SnapshotError
	fmt.Println(errors.As(err, &snapshot), snapshot.Code)
	// Output:
	// would write [a.txt] and delete [b.txt]
	// a.txt v1, b.txt removed true, cache/x kept
	// true SANDBOX_SNAPSHOT_MISSING_CHECKPOINT
}

// When a capture fails: a fifo (or a socket, a device, a link out of the
// workspace) is a SnapshotError with code SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY;
// exclude that path.
func ExampleSnapshotError() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "fifo")
	writeFiles(root, map[string]string{"a.txt": "a"})
	if err := syscall.Mkfifo(filepath.Join(root, "pipe"), 0o644); err != nil {
		log.Fatal(err)
	}
	_, err = checkpointd.CaptureSandboxCheckpoint(ctx, client,
		checkpointd.CaptureOptions{ThreadID: "example-fifo", WorkspaceRoot: root})
	var snapshot checkpointd.SnapshotError
	if errors.As(err, &snapshot) && snapshot.Code == checkpointd.CodeUnsupportedEntry {
		fmt.Println("unsupported entry:", snapshot.Metadata["paths"])
	}
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client, checkpointd.CaptureOptions{
		ThreadID: "example-fifo", WorkspaceRoot: root, Policy: &pb.Policy{Exclude: []string{"pipe"}}})
	fmt.Println(saved.GetFileCount(), err)
	// Output:
	// unsupported entry: pipe
	// 1 <nil>
}

// The store's reads: get returns nil for a missing id, list yields every
// checkpoint oldest first, the head is the newest; deleteHead of a checkpoint
// that is not the head is a NotHeadError.
func ExampleListCheckpoints() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "store")
	var ids, labels []string
	for _, label := range []string{"one", "two", "three"} {
		writeFiles(root, map[string]string{"n.txt": label})
		saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client,
			checkpointd.CaptureOptions{ThreadID: "example-store", WorkspaceRoot: root, Label: label})
		if err != nil {
			log.Fatal(err)
		}
		ids = append(ids, saved.Id)
	}
	for c, err := range checkpointd.ListCheckpoints(ctx, client, checkpointd.ListOptions{ThreadID: "example-store"}) {
		if err != nil {
			log.Fatal(err)
		}
		labels = append(labels, c.GetLabel())
	}
	fmt.Println(labels)
	missing, err := checkpointd.GetCheckpoint(ctx, client, "no-such-checkpoint", false)
	fmt.Println(missing == nil, err)

	head, _ := checkpointd.GetHead(ctx, client, "example-store")
	_, err = checkpointd.DeleteHead(ctx, client, "example-store", ids[0])
	fmt.Println(head == ids[2], errors.As(err, &checkpointd.NotHeadError{}))
	newHead, err := checkpointd.DeleteHead(ctx, client, "example-store", ids[2])
	fmt.Println(newHead == ids[1], err)
	// Output:
	// [one two three]
	// true <nil>
	// true true
	// true <nil>
}

// Branch from a version: a fork starts a new thread at a checkpoint of another.
func ExampleForkCheckpoint() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "fork")
	writeFiles(root, map[string]string{"plan.md": "try A"})
	source, err := checkpointd.CaptureSandboxCheckpoint(ctx, client,
		checkpointd.CaptureOptions{ThreadID: "example-main", WorkspaceRoot: root})
	if err != nil {
		log.Fatal(err)
	}
	forked, err := checkpointd.ForkCheckpoint(ctx, client, checkpointd.ForkOptions{
		SourceThreadID: "example-main", SourceCheckpointID: source.Id, DestinationThreadID: "example-try-b"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(forked.GetReason(), forked.GetForkedFromCheckpointId() == source.Id, forked.GetFileCount())
	// Output:
	// fork-root true 1
}

// Keep storage small: deleteCheckpoints keeps the head and the newest before
// it; a sweep (from a nightly job) deletes the blobs no checkpoint uses.
func ExampleDeleteCheckpoints() {
	ctx := context.Background()
	client, err := checkpointd.Dial(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	root := filepath.Join(os.Getenv("CHECKPOINTD_WORKSPACE"), "prune-example")
	for i := range 5 {
		writeFiles(root, map[string]string{"n.txt": fmt.Sprint(i)})
		if _, err := checkpointd.CaptureSandboxCheckpoint(ctx, client,
			checkpointd.CaptureOptions{ThreadID: "example-prune", WorkspaceRoot: root}); err != nil {
			log.Fatal(err)
		}
	}
	pruned, err := checkpointd.DeleteCheckpoints(ctx, client, "example-prune", 2, false)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted", pruned.GetDeletedCount(), "checkpoints")

	// Longer than your longest capture.
	swept, err := checkpointd.SweepSandboxBlobs(ctx, client, checkpointd.SweepOptions{OlderThan: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("Deleted %d blobs\n", len(swept.Deleted))
	// Output:
	// deleted 3 checkpoints
	// Deleted 0 blobs
}

func writeFiles(root string, files map[string]string) {
	for rel, content := range files {
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
