package checkpointd

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// AttemptMetadata is the header a retried capture carries (the attempt number,
// 2 and up).
const AttemptMetadata = "checkpointd-attempt"

// CaptureOptions are the seeds' capture options.
type CaptureOptions struct {
	ThreadID string
	// Label names the checkpoint (its reason is then "named"); "" for none.
	Label string
	// Policy picks which files to keep; pass the same one to the restore.
	Policy *pb.Policy
	// Secrets (at least 4 bytes each) are stored as zero bytes.
	Secrets [][]byte
	// Conversation messages, any JSON values (json.RawMessage is sent as it is).
	Conversation []any
	// Artifacts from the UploadArtifact RPC.
	Artifacts       []*pb.Artifact
	WorkspaceSubdir string
	SourceRunID     string
	// RequestID is the idempotency key; "" makes a random one. Retries reuse it.
	RequestID string
	// SkipIfUnchanged appends nothing when the files, conversation and artifacts
	// equal the head's (and no label is given): the result is the head, Unchanged.
	SkipIfUnchanged bool
	// OnProgress sees every progress event; OnEvent every event (a retried
	// attempt's events start again from started, with the same checkpoint id).
	OnProgress func(*pb.Progress)
	OnEvent    func(*pb.CaptureEvent)
}

// Captured is the saved checkpoint's summary, with the capture's stats.
type Captured struct {
	*pb.CheckpointSummary
	Stats *pb.CaptureStats
	// Replayed: a retry found the checkpoint an earlier attempt committed.
	Replayed bool
	// Unchanged: SkipIfUnchanged found nothing new; this is the head.
	Unchanged bool
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // UUID version 4
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func invalidArgument(message string, metadata map[string]string) error {
	return InvalidArgumentError{&Details{
		Code: CodeInvalidArgument, Message: message, Metadata: metadata,
		GRPCCode: codes.InvalidArgument, Status: status.New(codes.InvalidArgument, message),
	}}
}

func lostReply(what string) error {
	message := what + " stream ended without its done event"
	return Error{&Details{
		Code: "SANDBOX_SNAPSHOT_UNAVAILABLE", Message: message, Metadata: map[string]string{},
		GRPCCode: codes.Unavailable, Status: status.New(codes.Unavailable, message),
	}}
}

func (c *Client) captureOnce(ctx context.Context, req *pb.CaptureRequest, o *CaptureOptions) (*pb.CaptureDone, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Capture(ctx, req)
	if err != nil {
		return nil, err
	}
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, lostReply("the capture")
		}
		if err != nil {
			return nil, err
		}
		if o.OnEvent != nil {
			o.OnEvent(event)
		}
		if p := event.GetProgress(); p != nil && o.OnProgress != nil {
			o.OnProgress(p)
		}
		if done := event.GetDone(); done != nil {
			// Returning cancels the call; the daemon has committed by then (as the
			// Python and TypeScript clients do, without waiting for the trailers).
			return done, nil
		}
	}
}

// CaptureSandboxCheckpoint saves the daemon's workspace as a new checkpoint at
// the head of the thread. While another writer holds the thread it fails with
// WriterConflictError: skip that capture, the next one saves the same files.
func CaptureSandboxCheckpoint(ctx context.Context, c *Client, o CaptureOptions) (*Captured, error) {
	req := &pb.CaptureRequest{
		ThreadId:        o.ThreadID,
		Policy:          o.Policy,
		Secrets:         o.Secrets,
		Artifacts:       o.Artifacts,
		WorkspaceSubdir: o.WorkspaceSubdir,
		RequestId:       proto.String(o.RequestID),
		SkipIfUnchanged: o.SkipIfUnchanged,
	}
	if o.RequestID == "" {
		req.RequestId = proto.String(newRequestID())
	}
	if o.Label != "" {
		req.Label = proto.String(o.Label)
	}
	if o.SourceRunID != "" {
		req.SourceRunId = proto.String(o.SourceRunID)
	}
	for i, message := range o.Conversation {
		doc, err := json.Marshal(message)
		if err != nil {
			return nil, invalidArgument(fmt.Sprintf("conversation[%d] is not a JSON value: %v", i, err),
				map[string]string{"index": fmt.Sprint(i)})
		}
		req.Conversation = append(req.Conversation, string(doc))
	}
	backoff := c.retry.InitialBackoff
	for attempt := 1; ; attempt++ {
		attemptCtx := ctx
		if attempt > 1 {
			// A marked retry waits for an earlier attempt still holding the lease
			// (on this or another daemon); a first attempt fails fast.
			attemptCtx = metadata.AppendToOutgoingContext(ctx, AttemptMetadata, strconv.Itoa(attempt))
		}
		done, err := c.captureOnce(attemptCtx, req, &o)
		if err == nil {
			return &Captured{CheckpointSummary: done.GetCheckpoint(), Stats: done.GetStats(),
				Replayed: done.GetReplayed(), Unchanged: done.GetUnchanged()}, nil
		}
		var failure Error
		errors.As(err, &failure)
		lost := failure.Details != nil && failure.GRPCCode == codes.Unavailable
		// Once an attempt was lost, its lease may outlive it for a moment.
		ownConflict := attempt > 1 && errors.As(err, &WriterConflictError{})
		if !(lost || ownConflict) || attempt >= c.retry.MaxAttempts || ctx.Err() != nil {
			return nil, err
		}
		wait := backoff
		if failure.RetryAfter > 0 {
			wait = failure.RetryAfter
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(min(wait, c.retry.MaxBackoff)):
		}
		backoff = min(backoff*2, c.retry.MaxBackoff)
		if lost {
			_ = c.WaitServing(ctx, c.connectTimeout)
		}
	}
}

// RestoreOptions are the seeds' restore options.
type RestoreOptions struct {
	ThreadID string
	// CheckpointID restores that checkpoint of the thread instead of the newest.
	CheckpointID    string
	Policy          *pb.Policy
	WorkspaceSubdir string
	OnProgress      func(*pb.Progress)
}

// RestoreSandboxCheckpoint restores the newest (or the given) checkpoint of the
// thread into the daemon's workspace. It returns nil, nil when the thread has no
// checkpoint (the workspace stays as it is); an id not on the thread is a
// SnapshotError with Code CodeMissingCheckpoint.
func RestoreSandboxCheckpoint(ctx context.Context, c *Client, o RestoreOptions) (*pb.CheckpointSummary, error) {
	req := &pb.RestoreRequest{ThreadId: o.ThreadID, Policy: o.Policy, WorkspaceSubdir: o.WorkspaceSubdir}
	if o.CheckpointID != "" {
		req.CheckpointId = proto.String(o.CheckpointID)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Restore(ctx, req)
	if err != nil {
		return nil, err
	}
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, lostReply("the restore")
		}
		if err != nil {
			return nil, err
		}
		if p := event.GetProgress(); p != nil && o.OnProgress != nil {
			o.OnProgress(p)
		}
		if done := event.GetDone(); done != nil {
			_, _ = stream.Recv()
			if !done.GetRestored() {
				return nil, nil
			}
			return done.GetCheckpoint(), nil
		}
	}
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
