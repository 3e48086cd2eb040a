package checkpointd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	"google.golang.org/protobuf/proto"

	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// Checkpoint is one checkpoint as GetCheckpoint reads it: its summary, its
// artifacts and its conversation.
type Checkpoint struct {
	*pb.CheckpointSummary
	Artifacts []*pb.Artifact
	// Conversation holds the messages given to the capture, each one JSON value
	// (json.Unmarshal it into your message type); empty unless asked for.
	Conversation []json.RawMessage
}

// GetCheckpoint reads a checkpoint, and its conversation when
// includeConversation (messages can be large); nil, nil when no checkpoint has
// that id (as the reference store's get returns null).
func GetCheckpoint(ctx context.Context, c *Client, checkpointID string, includeConversation bool) (*Checkpoint, error) {
	reply, err := c.CheckpointdClient.GetCheckpoint(ctx,
		&pb.GetCheckpointRequest{CheckpointId: checkpointID, IncludeConversation: includeConversation})
	var missing SnapshotError
	if errors.As(err, &missing) && missing.Code == CodeMissingCheckpoint {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := &Checkpoint{CheckpointSummary: reply.GetCheckpoint(), Artifacts: reply.GetArtifacts()}
	for _, message := range reply.GetConversation() {
		out.Conversation = append(out.Conversation, json.RawMessage(message))
	}
	return out, nil
}

// ListOptions: which checkpoints ListCheckpoints yields.
type ListOptions struct {
	ThreadID string
	// NewestFirst yields the newest first; else oldest first (by created-at,
	// then by the UTF-8 bytes of the id).
	NewestFirst bool
	// Before yields only the checkpoints listed before this one.
	Before string
	// PageSize is how many each call to the daemon asks for (0: its default, 100).
	PageSize int
	// Stash lists the thread's stash instead: the live trees its restores
	// replaced, newest last (UndoRestore restores the newest).
	Stash bool
}

// ListCheckpoints yields every checkpoint of the thread, also those off the
// head's chain (an unknown thread yields none), fetching a page at a time:
//
//	for checkpoint, err := range checkpointd.ListCheckpoints(ctx, client, checkpointd.ListOptions{ThreadID: "t1"}) {
//		if err != nil { return err }
//		fmt.Println(checkpoint.Id, checkpoint.GetLabel())
//	}
//
// An error ends the iteration.
func ListCheckpoints(ctx context.Context, c *Client, o ListOptions) iter.Seq2[*pb.CheckpointSummary, error] {
	return func(yield func(*pb.CheckpointSummary, error) bool) {
		if o.PageSize < 0 {
			yield(nil, invalidArgument(fmt.Sprintf("PageSize must not be negative, not %d", o.PageSize),
				map[string]string{"field": "PageSize"}))
			return
		}
		req := &pb.ListCheckpointsRequest{ThreadId: o.ThreadID, PageSize: uint32(o.PageSize),
			NewestFirst: o.NewestFirst, Stash: o.Stash}
		if o.Before != "" {
			req.Before = proto.String(o.Before)
		}
		for {
			page, err := c.CheckpointdClient.ListCheckpoints(ctx, req)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, checkpoint := range page.GetCheckpoints() {
				if !yield(checkpoint, nil) {
					return
				}
			}
			if page.GetNextPageToken() == "" {
				return
			}
			req.PageToken = page.GetNextPageToken()
		}
	}
}

// ListThreads yields every thread that holds checkpoints, in the UTF-8 byte
// order of its id, fetching a page at a time. An error ends the iteration.
func ListThreads(ctx context.Context, c *Client) iter.Seq2[*pb.ThreadSummary, error] {
	return func(yield func(*pb.ThreadSummary, error) bool) {
		req := &pb.ListThreadsRequest{}
		for {
			page, err := c.CheckpointdClient.ListThreads(ctx, req)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, thread := range page.GetThreads() {
				if !yield(thread, nil) {
					return
				}
			}
			if page.GetNextPageToken() == "" {
				return
			}
			req.PageToken = page.GetNextPageToken()
		}
	}
}

// GetHead returns the id of the thread's head; "" when it has none.
func GetHead(ctx context.Context, c *Client, threadID string) (string, error) {
	reply, err := c.CheckpointdClient.GetHead(ctx, &pb.GetHeadRequest{ThreadId: threadID})
	return reply.GetCheckpointId(), err
}

// ForkOptions: which checkpoint to fork, and the new thread.
type ForkOptions struct {
	SourceThreadID      string
	SourceCheckpointID  string
	DestinationThreadID string
}

// ForkCheckpoint starts the destination thread (which must have no
// checkpoints) from a checkpoint of the source thread: its first checkpoint, a
// "fork-root" holding the same files, conversation and artifacts, with
// ForkedFromThreadId and ForkedFromCheckpointId set. An unknown source is
// CodeForkSourceNotFound (IsNotFound).
func ForkCheckpoint(ctx context.Context, c *Client, o ForkOptions) (*pb.CheckpointSummary, error) {
	reply, err := c.Fork(ctx, &pb.ForkRequest{SourceThreadId: o.SourceThreadID,
		SourceCheckpointId: o.SourceCheckpointID, DestinationThreadId: o.DestinationThreadID})
	if err != nil {
		return nil, err
	}
	return reply.GetCheckpoint(), nil
}

// DeleteHead removes the thread's head checkpoint and moves the head to its
// parent, which it returns ("" when the thread has no head now). A checkpoint
// that is not the head is a NotHeadError.
func DeleteHead(ctx context.Context, c *Client, threadID, checkpointID string) (string, error) {
	reply, err := c.CheckpointdClient.DeleteHead(ctx,
		&pb.DeleteHeadRequest{ThreadId: threadID, CheckpointId: checkpointID})
	return reply.GetHeadCheckpointId(), err
}

// DeleteCheckpoints keeps the head and its keep-1 nearest ancestors and deletes
// the thread's other checkpoints (with dryRun, reports those it would delete):
// DeletedCheckpointIds oldest first (at most the first 10,000, IdsTruncated),
// DeletedCount all of them.
func DeleteCheckpoints(ctx context.Context, c *Client, threadID string, keep int, dryRun bool) (*pb.PruneResponse, error) {
	if keep < 1 {
		return nil, invalidArgument(fmt.Sprintf("keep must be at least 1, not %d", keep),
			map[string]string{"keep": fmt.Sprint(keep)})
	}
	return c.Prune(ctx, &pb.PruneRequest{ThreadId: threadID, Keep: uint32(keep), DryRun: dryRun})
}

// SweepOptions: which blobs a sweep may delete.
type SweepOptions struct {
	// OlderThan: only blobs uploaded at least this long ago are deleted; longer
	// than your longest capture. Zero: the daemon's default (1 h).
	OlderThan time.Duration
	// AnyAge deletes unused blobs of any age (OlderThan is then ignored).
	AnyAge bool
	DryRun bool
	// RepackBelowPercent: repack a pack whose live blobs fill less than this
	// percentage of it (1-100). Zero: the daemon's default (50).
	RepackBelowPercent int
	// NeverRepack: no pack is repacked (RepackBelowPercent is then ignored).
	NeverRepack bool
}

// SweepResult gathers a sweep's batches.
type SweepResult struct {
	Deleted  []string
	Kept     []*pb.KeptBlob
	Failures []*pb.SweepFailure
	Summary  *pb.SweepBlobsSummary
}

// SweepSandboxBlobs deletes the blobs no checkpoint uses (see SweepOptions).
// The daemon streams results in batches; use the SweepBlobs RPC directly to
// handle a huge bucket batch by batch.
func SweepSandboxBlobs(ctx context.Context, c *Client, o SweepOptions) (*SweepResult, error) {
	req := &pb.SweepBlobsRequest{DryRun: o.DryRun}
	switch {
	case o.AnyAge:
		req.OlderThanMs = proto.Uint64(0)
	case o.OlderThan < 0:
		return nil, invalidArgument(fmt.Sprintf("OlderThan must not be negative, not %s", o.OlderThan),
			map[string]string{"older_than_ms": fmt.Sprint(o.OlderThan.Milliseconds())})
	case o.OlderThan > 0:
		req.OlderThanMs = proto.Uint64(uint64(o.OlderThan.Milliseconds()))
	}
	switch {
	case o.NeverRepack:
		req.RepackBelowPercent = proto.Uint32(0)
	case o.RepackBelowPercent < 0 || o.RepackBelowPercent > 100:
		return nil, invalidArgument(
			fmt.Sprintf("RepackBelowPercent must be in [0, 100], not %d", o.RepackBelowPercent),
			map[string]string{"field": "repack_below_percent", "value": fmt.Sprint(o.RepackBelowPercent)})
	case o.RepackBelowPercent > 0:
		req.RepackBelowPercent = proto.Uint32(uint32(o.RepackBelowPercent))
	}
	stream, err := c.SweepBlobs(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &SweepResult{}
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if out.Summary == nil {
				return out, lostReply("the sweep")
			}
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if batch := event.GetBatch(); batch != nil {
			out.Deleted = append(out.Deleted, batch.GetDeleted()...)
			out.Kept = append(out.Kept, batch.GetKept()...)
			out.Failures = append(out.Failures, batch.GetFailures()...)
		}
		if summary := event.GetSummary(); summary != nil {
			out.Summary = summary
		}
	}
}

// UploadArtifactBytes streams an artifact's bytes to the daemon (in 256 KiB
// chunks) and returns the record to pass in CaptureOptions.Artifacts.
func UploadArtifactBytes(ctx context.Context, c *Client, name, mimeType string, data io.Reader) (*pb.Artifact, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.UploadArtifact(ctx)
	if err != nil {
		return nil, err
	}
	first := &pb.UploadArtifactRequest{Part: &pb.UploadArtifactRequest_Metadata{
		Metadata: &pb.UploadArtifactMetadata{Name: name, MimeType: mimeType}}}
	if err := stream.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	buf := make([]byte, 256*1024)
	for {
		n, readErr := io.ReadFull(data, buf)
		if n > 0 {
			chunk := &pb.UploadArtifactRequest{Part: &pb.UploadArtifactRequest_Chunk{Chunk: append([]byte(nil), buf[:n]...)}}
			if err := stream.Send(chunk); err != nil {
				if errors.Is(err, io.EOF) {
					break // the daemon ended the call: CloseAndRecv has its status
				}
				return nil, err
			}
		}
		if errors.Is(readErr, io.EOF) || errors.Is(readErr, io.ErrUnexpectedEOF) {
			break
		}
		if readErr != nil {
			return nil, readErr
		}
	}
	reply, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return reply.GetArtifact(), nil
}
