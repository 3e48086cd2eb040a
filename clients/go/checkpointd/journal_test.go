package checkpointd_test

// How the daemon learns what changed, as the SDK shows it (docs/design.md, "The
// change journal"): the server's watch mode and why, each capture's scan mode
// with its reason and the entries it examined, and the chunks a large file is
// stored as.

import (
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

func startWatching(t *testing.T, mode string) (*daemon, *checkpointd.Client) {
	t.Helper()
	d, err := startDaemon(false, "", []string{"--watch", mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	return d, d.dial(t)
}

func capabilities(t *testing.T, client *checkpointd.Client) *pb.Capabilities {
	t.Helper()
	info, err := client.GetServerInfo(ctx(t), &pb.GetServerInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return info.GetCapabilities()
}

func capture(t *testing.T, client *checkpointd.Client, thread string) *checkpointd.Captured {
	t.Helper()
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{ThreadID: thread})
	if err != nil {
		t.Fatal(err)
	}
	return saved
}

func entriesOf(t *testing.T, client *checkpointd.Client, checkpointID string) map[string]*pb.Entry {
	t.Helper()
	stream, err := client.ListEntries(ctx(t), &pb.ListEntriesRequest{CheckpointId: checkpointID})
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]*pb.Entry{}
	for {
		page, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, entry := range page.GetEntries() {
			entries[entry.GetPath()] = entry
		}
	}
}

func TestJournalScanModeAndWatchModeComeThrough(t *testing.T) {
	d, client := startWatching(t, "inotify")
	caps := capabilities(t, client)
	if caps.GetWatchMode() != "inotify" || !strings.Contains(caps.GetWatchDetail(), "inotify") {
		t.Fatalf("watch mode %q, detail %q", caps.GetWatchMode(), caps.GetWatchDetail())
	}

	writeTree(t, d.workspace, map[string]string{"a.txt": "alpha", "dir/b.txt": "beta"})
	first := capture(t, client, "t-journal").Stats
	if first.GetScanMode() != "full" || first.GetFullScanReason() == "" || first.GetEntriesExamined() < first.GetEntries() {
		t.Fatalf("a fresh daemon's first capture scans in full and says why: %v", first)
	}
	writeTree(t, d.workspace, map[string]string{"dir/c.txt": "gamma"})
	second := capture(t, client, "t-journal").Stats
	if second.GetScanMode() != "journal" || second.GetFullScanReason() != "" ||
		second.GetEntries() != first.GetEntries()+1 {
		t.Fatalf("the next capture follows the journal: %v", second)
	}
	if second.GetEntriesExamined() == 0 || second.GetEntriesExamined() >= first.GetEntriesExamined() {
		t.Fatalf("the journal examines only what changed: %v, then %v", first, second)
	}
}

func TestEntriesSayTheirChunkCount(t *testing.T) {
	d, client := startWatching(t, "inotify")
	large := make([]byte, 1536*1024) // above the default 1 MiB threshold
	if _, err := rand.Read(large); err != nil {
		t.Fatal(err)
	}
	writeTree(t, d.workspace, map[string]string{"small.txt": "small", "dir/x.txt": "x"})
	if err := os.WriteFile(filepath.Join(d.workspace, "large.bin"), large, 0o644); err != nil {
		t.Fatal(err)
	}
	entries := entriesOf(t, client, capture(t, client, "t-chunks").Id)
	if entries["large.bin"].GetChunkCount() <= 1 {
		t.Fatalf("a large file is stored as chunks: %v", entries["large.bin"])
	}
	if entries["small.txt"].GetChunkCount() != 0 || entries["dir"].GetChunkCount() != 0 || len(entries) != 4 {
		t.Fatalf("a small file and a directory have no chunks: %v", entries)
	}
}

func TestUnwatchedDaemonScansInFullAndSaysWhy(t *testing.T) {
	d, client := startWatching(t, "off")
	if caps := capabilities(t, client); caps.GetWatchMode() != "off" || caps.GetWatchDetail() == "" {
		t.Fatalf("watch mode %q, detail %q", caps.GetWatchMode(), caps.GetWatchDetail())
	}
	for _, content := range []string{"one", "two"} {
		writeTree(t, d.workspace, map[string]string{"a.txt": content})
		stats := capture(t, client, "t-off").Stats
		if stats.GetScanMode() != "full" || stats.GetFullScanReason() == "" || stats.GetEntriesExamined() == 0 {
			t.Fatalf("stats %v", stats)
		}
	}
}
