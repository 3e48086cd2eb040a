package checkpointd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

const tcpToken = "tok-go-123"

var unixDaemon, tcpDaemon *daemon

func TestMain(m *testing.M) {
	var err error
	if unixDaemon, err = startDaemon(false, "", nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if tcpDaemon, err = startDaemon(true, tcpToken, nil); err != nil {
		unixDaemon.stop()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The examples dial "" and find the daemon and its workspace here, as a
	// program beside a daemon does.
	os.Setenv(checkpointd.EnvAddress, unixDaemon.address)
	os.Setenv(checkpointd.EnvWorkspace, unixDaemon.workspace)
	code := m.Run()
	unixDaemon.stop()
	tcpDaemon.stop()
	os.Exit(code)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCaptureShowsProgressAndRestoresAfterACrash(t *testing.T) {
	client := unixDaemon.dial(t)
	root := filepath.Join(unixDaemon.workspace, "crash")
	writeTree(t, root, map[string]string{"main.go": "package main\n", "src/lib.go": "package src\n"})

	none, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-crash", WorkspaceSubdir: "crash"})
	if err != nil || none != nil {
		t.Fatalf("a thread with no checkpoint restores nothing: %v %v", none, err)
	}
	var phases []string
	var started string
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{
		ThreadID:        "t-crash",
		Label:           "before crash",
		Conversation:    []any{map[string]string{"role": "user", "content": "write main.go"}},
		WorkspaceSubdir: "crash",
		OnProgress:      func(p *pb.Progress) { phases = append(phases, p.GetPhase()) },
		OnEvent: func(e *pb.CaptureEvent) {
			if s := e.GetStarted(); s != nil {
				started = s.GetCheckpointId()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if saved.Id != started || saved.GetLabel() != "before crash" || saved.GetReason() != "named" {
		t.Fatalf("summary %v, started %q", saved.CheckpointSummary, started)
	}
	if len(phases) == 0 || saved.Stats.GetEntries() == 0 || saved.Replayed {
		t.Fatalf("progress %v, stats %v", phases, saved.Stats)
	}

	if err := os.RemoveAll(filepath.Join(root, "src")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, root, map[string]string{"main.go": "garbage", "new.txt": "not in the checkpoint"})
	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-crash", WorkspaceSubdir: "crash"})
	if err != nil || restored.GetId() != saved.Id {
		t.Fatalf("restore: %v %v", restored, err)
	}
	if read(t, filepath.Join(root, "main.go")) != "package main\n" || read(t, filepath.Join(root, "src/lib.go")) != "package src\n" {
		t.Fatal("files not restored")
	}
	if _, err := os.Stat(filepath.Join(root, "new.txt")); !os.IsNotExist(err) {
		t.Fatal("a file not in the checkpoint survived the restore")
	}

	// Every RPC is a method; 64-bit fields keep their precision (mtime in ns).
	stream, err := client.ListEntries(ctx(t), &pb.ListEntriesRequest{CheckpointId: saved.Id})
	if err != nil {
		t.Fatal(err)
	}
	chunk, err := stream.Recv()
	if err != nil || len(chunk.GetEntries()) == 0 {
		t.Fatalf("entries: %v", err)
	}
	for _, entry := range chunk.GetEntries() {
		if entry.GetKind() == pb.EntryKind_ENTRY_KIND_FILE && entry.GetMtimeNs() < 1<<53 {
			t.Fatalf("mtime_ns %d", entry.GetMtimeNs())
		}
	}
}

func TestMissingCheckpointIsASnapshotError(t *testing.T) {
	client := unixDaemon.dial(t)
	_, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-none", CheckpointID: "nope"})
	var snapshot checkpointd.SnapshotError
	if !errors.As(err, &snapshot) || snapshot.Code != checkpointd.CodeMissingCheckpoint {
		t.Fatalf("got %T %v", err, err)
	}
	if status.Code(err) != codes.NotFound || snapshot.GRPCCode != codes.NotFound {
		t.Fatalf("status %v", status.Code(err))
	}
}

func TestWriterConflictMatchesItsType(t *testing.T) {
	client := unixDaemon.dial(t)
	writeTree(t, filepath.Join(unixDaemon.workspace, "busy"), map[string]string{"a.txt": "a"})
	release := holdLease(t, unixDaemon, "t-busy")
	started := time.Now()
	_, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client,
		checkpointd.CaptureOptions{ThreadID: "t-busy", WorkspaceSubdir: "busy"})
	release()
	if !errors.As(err, &checkpointd.WriterConflictError{}) {
		t.Fatalf("got %T %v", err, err)
	}
	var byPointer *checkpointd.WriterConflictError
	var base checkpointd.Error
	var basePointer *checkpointd.Error
	if !errors.As(err, &byPointer) || !errors.As(err, &base) || !errors.As(err, &basePointer) {
		t.Fatal("the pointer and base forms match too")
	}
	if errors.As(err, &checkpointd.SnapshotError{}) {
		t.Fatal("a writer conflict is not a snapshot error")
	}
	if byPointer.Code != checkpointd.CodeWriterConflict || byPointer.Metadata["thread_id"] != "t-busy" ||
		base.GRPCCode != codes.Aborted || status.Code(err) != codes.Aborted {
		t.Fatalf("details %+v", byPointer.Details)
	}
	// The daemon says when the holder's lease (120 s) expires.
	if byPointer.RetryAfter <= 0 || byPointer.RetryAfter > 120*time.Second || byPointer.Metadata["expires_at_ms"] == "" {
		t.Fatalf("retry after %s, metadata %v", byPointer.RetryAfter, byPointer.Metadata)
	}
	if time.Since(started) > 5*time.Second {
		t.Fatal("a conflict fails fast, it is not retried")
	}
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client,
		checkpointd.CaptureOptions{ThreadID: "t-busy", WorkspaceSubdir: "busy"}); err != nil {
		t.Fatalf("after the lease is released: %v", err)
	}
}

func TestSameRequestIDReturnsTheSameCheckpoint(t *testing.T) {
	client := unixDaemon.dial(t)
	writeTree(t, filepath.Join(unixDaemon.workspace, "replay"), map[string]string{"a.txt": "a"})
	opts := checkpointd.CaptureOptions{ThreadID: "t-replay", WorkspaceSubdir: "replay", RequestID: "req-1"}
	first, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, opts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, opts)
	if err != nil || again.Id != first.Id || !again.Replayed || first.Replayed {
		t.Fatalf("first %v, again %v, %v", first.Id, again, err)
	}
}

func TestPruneAndSweep(t *testing.T) {
	client := unixDaemon.dial(t)
	root := filepath.Join(unixDaemon.workspace, "prune")
	var ids []string
	for i := 0; i < 3; i++ {
		writeTree(t, root, map[string]string{"n.txt": fmt.Sprintf("version %d", i)})
		saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client,
			checkpointd.CaptureOptions{ThreadID: "t-prune", WorkspaceSubdir: "prune"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, saved.Id)
	}
	pruned, err := checkpointd.DeleteCheckpoints(ctx(t), client, "t-prune", 1, false)
	deleted := pruned.GetDeletedCheckpointIds()
	if err != nil || len(deleted) != 2 || deleted[0] != ids[0] || deleted[1] != ids[1] || pruned.GetDeletedCount() != 2 {
		t.Fatalf("deleted %v, %v", pruned, err)
	}
	if _, err := checkpointd.DeleteCheckpoints(ctx(t), client, "t-prune", 0, false); !errors.As(err, &checkpointd.InvalidArgumentError{}) {
		t.Fatalf("keep 0: %v", err)
	}
	swept, err := checkpointd.SweepSandboxBlobs(ctx(t), client, checkpointd.SweepOptions{AnyAge: true, DryRun: true})
	if err != nil || len(swept.Deleted) < 2 || !swept.Summary.GetDryRun() || swept.Summary.GetOlderThanMs() != 0 {
		t.Fatalf("sweep %+v, %v", swept, err)
	}
	defaults, err := checkpointd.SweepSandboxBlobs(ctx(t), client, checkpointd.SweepOptions{DryRun: true})
	if err != nil || defaults.Summary.GetOlderThanMs() != 3_600_000 || len(defaults.Deleted) != 0 ||
		defaults.Summary.GetRepackBelowPercent() != 50 {
		t.Fatalf("default sweep %+v, %v", defaults, err)
	}
	never, err := checkpointd.SweepSandboxBlobs(ctx(t), client, checkpointd.SweepOptions{DryRun: true, NeverRepack: true})
	if err != nil || never.Summary.GetRepackBelowPercent() != 0 {
		t.Fatalf("never repack %+v, %v", never, err)
	}
	chosen, err := checkpointd.SweepSandboxBlobs(ctx(t), client, checkpointd.SweepOptions{DryRun: true, RepackBelowPercent: 30})
	if err != nil || chosen.Summary.GetRepackBelowPercent() != 30 {
		t.Fatalf("repack below 30 %+v, %v", chosen, err)
	}
	if _, err := checkpointd.SweepSandboxBlobs(ctx(t), client, checkpointd.SweepOptions{RepackBelowPercent: 101}); !errors.As(err, &checkpointd.InvalidArgumentError{}) {
		t.Fatalf("repack below 101: %v", err)
	}
	// The daemon's own check (a raw request past the SDK's).
	raw, err := client.SweepBlobs(ctx(t), &pb.SweepBlobsRequest{DryRun: true, RepackBelowPercent: proto.Uint32(101)})
	if err == nil {
		_, err = raw.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("raw repack below 101: %v", err)
	}
}

func TestMissingBlobIsADataLossSnapshotError(t *testing.T) {
	d, err := startDaemon(false, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	client := d.dial(t)
	writeTree(t, d.workspace, map[string]string{"a.txt": "precious bytes"})
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{ThreadID: "t-loss"}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(d.blobsDir)
	for _, entry := range entries { // every object of the bucket, whatever its layout
		_ = os.RemoveAll(filepath.Join(d.blobsDir, entry.Name()))
	}
	_ = os.Remove(filepath.Join(d.workspace, "a.txt"))
	_, err = checkpointd.RestoreSandboxCheckpoint(ctx(t), client, checkpointd.RestoreOptions{ThreadID: "t-loss"})
	var snapshot *checkpointd.SnapshotError
	if !errors.As(err, &snapshot) || snapshot.Code != checkpointd.CodeMissingBlob || status.Code(err) != codes.DataLoss {
		t.Fatalf("got %T %v", err, err)
	}
	if len(snapshot.Metadata) == 0 {
		t.Fatal("the metadata names what is missing")
	}
	if _, err := os.Stat(filepath.Join(d.workspace, "a.txt")); !os.IsNotExist(err) {
		t.Fatal("a failed restore changes nothing")
	}
}

func TestTCPNeedsTheToken(t *testing.T) {
	for _, token := range []string{"", "wrong"} {
		c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := checkpointd.Dial(c, tcpDaemon.address, checkpointd.WithToken(token))
		cancel()
		var e checkpointd.Error
		if !errors.As(err, &e) || e.Code != checkpointd.CodeUnauthenticated || status.Code(err) != codes.Unauthenticated {
			t.Fatalf("token %q: %T %v", token, err, err)
		}
	}
	client := tcpDaemon.dial(t)
	writeTree(t, filepath.Join(tcpDaemon.workspace, "tcp"), map[string]string{"a.txt": "over tcp"})
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client,
		checkpointd.CaptureOptions{ThreadID: "t-tcp", WorkspaceSubdir: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(tcpDaemon.workspace, "tcp", "a.txt"))
	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx(t), client,
		checkpointd.RestoreOptions{ThreadID: "t-tcp", WorkspaceSubdir: "tcp"})
	if err != nil || restored.GetId() != saved.Id || read(t, filepath.Join(tcpDaemon.workspace, "tcp", "a.txt")) != "over tcp" {
		t.Fatalf("restore %v %v", restored, err)
	}
}

func TestLostReplyIsRetriedWithTheSameRequestID(t *testing.T) {
	p := startProxy(t, tcpDaemon.address[len("tcp://"):])
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := checkpointd.Dial(c, p.address(), checkpointd.WithToken(tcpToken))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	writeTree(t, filepath.Join(tcpDaemon.workspace, "lost"), map[string]string{"a.txt": "committed, then lost"})
	// The label is in the done event only: the daemon has appended by then.
	p.loseReplyContaining("label-only-in-done")
	var started []string
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{
		ThreadID: "t-lost", Label: "label-only-in-done", WorkspaceSubdir: "lost",
		OnEvent: func(e *pb.CaptureEvent) {
			if s := e.GetStarted(); s != nil {
				started = append(started, s.GetCheckpointId())
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.cuts != 1 || len(started) != 2 || started[0] != started[1] || saved.Id != started[0] || !saved.Replayed {
		t.Fatalf("cuts %d, started %v, saved %v replayed %v", p.cuts, started, saved.Id, saved.Replayed)
	}
	list, err := client.ListCheckpoints(ctx(t), &pb.ListCheckpointsRequest{ThreadId: "t-lost"})
	if err != nil || len(list.GetCheckpoints()) != 1 {
		t.Fatalf("one checkpoint, not two: %v %v", list, err)
	}
}

func TestArtifactsUploadCaptureAndReadBack(t *testing.T) {
	client := unixDaemon.dial(t)
	writeTree(t, filepath.Join(unixDaemon.workspace, "art"), map[string]string{"a.txt": "a"})
	big := bytes.Repeat([]byte{7}, 600*1024) // several upload chunks
	artifact, err := checkpointd.UploadArtifactBytes(ctx(t), client, "report.bin", "application/octet-stream", bytes.NewReader(big))
	if err != nil || artifact.GetSize() != uint64(len(big)) {
		t.Fatalf("upload %v %v", artifact, err)
	}
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{
		ThreadID: "t-art", WorkspaceSubdir: "art", Artifacts: []*pb.Artifact{artifact}})
	if err != nil || saved.GetArtifactCount() != 1 {
		t.Fatalf("capture %v %v", saved, err)
	}
	stream, err := client.ReadArtifact(ctx(t), &pb.ReadArtifactRequest{BlobKey: artifact.GetBlobKey()})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, chunk.GetData()...)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes", len(got))
	}
}

func TestSkipIfUnchangedAppendsNothing(t *testing.T) {
	client := unixDaemon.dial(t)
	root := filepath.Join(unixDaemon.workspace, "skip")
	writeTree(t, root, map[string]string{"a.txt": "same"})
	opts := checkpointd.CaptureOptions{ThreadID: "t-skip", WorkspaceSubdir: "skip", SkipIfUnchanged: true}
	first, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, opts)
	if err != nil || first.Unchanged {
		t.Fatalf("first %v %v", first, err)
	}
	again, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, opts)
	if err != nil || !again.Unchanged || again.Id != first.Id {
		t.Fatalf("again %v %v", again, err)
	}
	writeTree(t, root, map[string]string{"a.txt": "changed"})
	third, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, opts)
	if err != nil || third.Unchanged || third.GetParentCheckpointId() != first.Id {
		t.Fatalf("third %v %v", third, err)
	}
	threads, err := client.ListThreads(ctx(t), &pb.ListThreadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, thread := range threads.GetThreads() {
		if thread.GetThreadId() == "t-skip" && thread.GetCheckpointCount() == 2 {
			return
		}
	}
	t.Fatalf("ListThreads: %v", threads)
}
