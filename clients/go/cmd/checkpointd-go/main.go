// Command checkpointd-go captures a thread and restores it through the checkpointd
// daemon, then prints one JSON summary. It shows the daemon from Go (grpc-go).
//
//	checkpointd-go [-token T] <address> <thread> [capture|restore|both|orchestrate]
//
// "orchestrate" (after a capture of the thread) drives ListThreads,
// ListCheckpoints newest first, a Restore dry run, Capture skip_if_unchanged,
// Fork provenance, a SweepBlobs dry run (a stream) and GetServerInfo's limits.
//
// <address> is "unix:///abs/path.sock" (the daemon's default) or "host:port".
// On a gRPC error it prints {"error": {"code", "status", "reason", "metadata"}}
// (the numeric gRPC code, its name as gRPC spells it, and the reason and metadata
// of the google.rpc.ErrorInfo in the status details) and exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

type captureResult struct {
	CheckpointID   string `json:"checkpoint_id"`
	StartedID      string `json:"started_id"`
	Files          uint64 `json:"files"`
	ProgressEvents int    `json:"progress_events"`
}

type restoreResult struct {
	Restored     bool   `json:"restored"`
	CheckpointID string `json:"checkpoint_id"`
}

type orchestrateResult struct {
	Threads                []string          `json:"threads"`
	Heads                  map[string]string `json:"heads"`
	NewestID               string            `json:"newest_id"`
	PlanFilesWritten       uint64            `json:"plan_files_written"`
	PlanFilesKept          uint64            `json:"plan_files_kept"`
	Unchanged              bool              `json:"unchanged"`
	UnchangedID            string            `json:"unchanged_id"`
	ForkedFromCheckpointID string            `json:"forked_from_checkpoint_id"`
	SweepListed            uint64            `json:"sweep_listed"`
	SweepSummary           bool              `json:"sweep_summary"`
	MaxMessageBytes        uint32            `json:"max_message_bytes"`
	AuthMode               string            `json:"auth_mode"`
}

type result struct {
	Thread          string             `json:"thread"`
	Version         string             `json:"version"`
	ProtocolVersion uint32             `json:"protocol_version"`
	Capture         *captureResult     `json:"capture,omitempty"`
	Restore         *restoreResult     `json:"restore,omitempty"`
	Orchestrate     *orchestrateResult `json:"orchestrate,omitempty"`
}

type errorReport struct {
	Code     codes.Code        `json:"code"`
	Status   string            `json:"status"`
	Reason   string            `json:"reason"`
	Message  string            `json:"message"`
	Metadata map[string]string `json:"metadata"`
}

// describe turns a gRPC error into its status code and ErrorInfo.
func describe(err error) errorReport {
	st, _ := status.FromError(err)
	report := errorReport{Code: st.Code(), Status: checkpointd.StatusNames[st.Code()], Message: st.Message(),
		Metadata: map[string]string{}}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			report.Reason = info.GetReason()
			report.Metadata = info.GetMetadata()
		}
	}
	return report
}

func capture(ctx context.Context, client pb.CheckpointdClient, thread string) (*captureResult, error) {
	label := "from go"
	stream, err := client.Capture(ctx, &pb.CaptureRequest{
		ThreadId:     thread,
		Label:        &label,
		Conversation: []string{`{"role":"user","content":"captured by go"}`},
	})
	if err != nil {
		return nil, err
	}
	out := &captureResult{}
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		switch e := event.Event.(type) {
		case *pb.CaptureEvent_Started:
			out.StartedID = e.Started.GetCheckpointId()
		case *pb.CaptureEvent_Progress:
			out.ProgressEvents++
		case *pb.CaptureEvent_Done:
			out.CheckpointID = e.Done.GetCheckpoint().GetId()
			out.Files = e.Done.GetCheckpoint().GetFileCount()
		}
	}
}

func restore(ctx context.Context, client pb.CheckpointdClient, thread string) (*restoreResult, error) {
	stream, err := client.Restore(ctx, &pb.RestoreRequest{ThreadId: thread})
	if err != nil {
		return nil, err
	}
	out := &restoreResult{}
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if done := event.GetDone(); done != nil {
			out.Restored = done.GetRestored()
			out.CheckpointID = done.GetCheckpoint().GetId()
		}
	}
}

// drain reads a server stream to its end, handing each message to each.
func drain[T any](recv func() (T, error), each func(T)) error {
	for {
		message, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		each(message)
	}
}

func orchestrate(ctx context.Context, client pb.CheckpointdClient, thread string, info *pb.GetServerInfoResponse) (*orchestrateResult, error) {
	out := &orchestrateResult{Heads: map[string]string{}}
	threads, err := client.ListThreads(ctx, &pb.ListThreadsRequest{PageSize: 100})
	if err != nil {
		return nil, err
	}
	for _, t := range threads.GetThreads() {
		out.Threads = append(out.Threads, t.GetThreadId())
		out.Heads[t.GetThreadId()] = t.GetHeadCheckpointId()
	}
	newest, err := client.ListCheckpoints(ctx, &pb.ListCheckpointsRequest{ThreadId: thread, PageSize: 1, NewestFirst: true})
	if err != nil || len(newest.GetCheckpoints()) == 0 {
		return nil, fmt.Errorf("newest checkpoint: %v", err)
	}
	out.NewestID = newest.GetCheckpoints()[0].GetId()
	plan, err := client.Restore(ctx, &pb.RestoreRequest{ThreadId: thread, DryRun: true})
	if err != nil {
		return nil, err
	}
	if err := drain(plan.Recv, func(e *pb.RestoreEvent) {
		if done := e.GetDone(); done != nil {
			out.PlanFilesWritten = done.GetPlan().GetFilesWritten()
			out.PlanFilesKept = done.GetPlan().GetFilesKept()
		}
	}); err != nil {
		return nil, err
	}
	// No label: a label always asks for a new, named checkpoint.
	again, err := client.Capture(ctx, &pb.CaptureRequest{
		ThreadId: thread, SkipIfUnchanged: true,
		Conversation: []string{`{"role":"user","content":"captured by go"}`},
	})
	if err != nil {
		return nil, err
	}
	if err := drain(again.Recv, func(e *pb.CaptureEvent) {
		if done := e.GetDone(); done != nil {
			out.Unchanged = done.GetUnchanged()
			out.UnchangedID = done.GetCheckpoint().GetId()
		}
	}); err != nil {
		return nil, err
	}
	fork, err := client.Fork(ctx, &pb.ForkRequest{
		SourceThreadId: thread, SourceCheckpointId: out.NewestID, DestinationThreadId: thread + "-fork",
	})
	if err != nil {
		return nil, err
	}
	out.ForkedFromCheckpointID = fork.GetCheckpoint().GetForkedFromCheckpointId()
	sweep, err := client.SweepBlobs(ctx, &pb.SweepBlobsRequest{DryRun: true})
	if err != nil {
		return nil, err
	}
	if err := drain(sweep.Recv, func(e *pb.SweepBlobsEvent) {
		if summary := e.GetSummary(); summary != nil {
			out.SweepSummary = summary.GetDryRun()
			out.SweepListed = summary.GetListedCount()
		}
	}); err != nil {
		return nil, err
	}
	out.MaxMessageBytes = info.GetCapabilities().GetMaxMessageBytes()
	out.AuthMode = info.GetCapabilities().GetAuthMode()
	return out, nil
}

func run(address, thread, mode, token string) (*result, error) {
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pb.NewCheckpointdClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	info, err := client.GetServerInfo(ctx, &pb.GetServerInfoRequest{})
	if err != nil {
		return nil, err
	}
	out := &result{Thread: thread, Version: info.GetVersion(), ProtocolVersion: info.GetProtocolVersion()}
	if mode == "capture" || mode == "both" {
		if out.Capture, err = capture(ctx, client, thread); err != nil {
			return nil, err
		}
	}
	if mode == "restore" || mode == "both" {
		if out.Restore, err = restore(ctx, client, thread); err != nil {
			return nil, err
		}
	}
	if mode == "orchestrate" {
		if out.Orchestrate, err = orchestrate(ctx, client, thread, info); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func main() {
	token := flag.String("token", os.Getenv("CHECKPOINTD_TOKEN"), "bearer token (TCP)")
	flag.Parse()
	if flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: checkpointd-go [-token T] <address> <thread> [capture|restore|both|orchestrate]")
		os.Exit(2)
	}
	mode := "both"
	if flag.NArg() > 2 {
		mode = flag.Arg(2)
	}
	out, err := run(flag.Arg(0), flag.Arg(1), mode, *token)
	encoder := json.NewEncoder(os.Stdout)
	if err != nil {
		_ = encoder.Encode(map[string]errorReport{"error": describe(err)})
		os.Exit(1)
	}
	_ = encoder.Encode(out)
}
