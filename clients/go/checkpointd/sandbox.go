package checkpointd

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// AttemptMetadata is the header a retried capture carries (the attempt number,
// 2 and up).
const AttemptMetadata = "checkpointd-attempt"

// CaptureOptions are the options of captureSandboxCheckpoint in TanStack AI's
// @tanstack/ai-sandbox API, and the daemon's own.
type CaptureOptions struct {
	ThreadID string
	// Label names the checkpoint (its reason is then "named"); "" for none.
	Label string
	// Policy picks which files to keep; pass the same one to the restore.
	Policy *pb.Policy
	// Secrets (at least 4 bytes each) are stored as zero bytes.
	Secrets [][]byte
	// SecretNames name the Secrets (parallel to them, e.g. the variables they
	// came from), so that a restore finds each by name whatever their order.
	SecretNames []string
	// Conversation messages, any JSON values (json.RawMessage is sent as it is).
	Conversation []any
	// Artifacts from UploadArtifactBytes (or the UploadArtifact RPC).
	Artifacts []*pb.Artifact
	// WorkspaceRoot is the folder to capture as the caller sees it: the
	// daemon's workspace (WithWorkspace) or a folder within it; else
	// InvalidArgumentError. WorkspaceSubdir says the same relative to the
	// workspace; give one of them ("" and "": the whole workspace).
	WorkspaceRoot   string
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
	// Stats say what the capture read and uploaded, and how it examined the
	// workspace: ScanMode ("journal" or "full"), FullScanReason (why a full
	// scan ran) and EntriesExamined (entries stat'ed plus directories listed).
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

func lostReply(what string) error {
	return newError(CodeUnavailable, codes.Unavailable, what+" stream ended without its done event", nil)
}

// workspaceSubdir turns a WorkspaceRoot into the daemon's workspace_subdir
// ("." for the workspace itself). A root that is not absolute or lies outside
// the workspace is a SnapshotError with CodeInvalidPath, as the daemon's own
// check of a workspace_subdir.
func (c *Client) workspaceSubdir(root, subdir string) (string, error) {
	if root == "" {
		return subdir, nil
	}
	field := map[string]string{"field": "WorkspaceRoot", "path": root}
	if subdir != "" {
		return "", invalidArgument("give WorkspaceRoot or WorkspaceSubdir, not both", field)
	}
	rel, err := filepath.Rel(filepath.Clean(c.workspace), filepath.Clean(root))
	switch {
	case !filepath.IsAbs(root):
		return "", newError(CodeInvalidPath, codes.InvalidArgument,
			fmt.Sprintf("WorkspaceRoot %q is not an absolute path", root), field)
	case err != nil || rel == ".." || strings.HasPrefix(rel, "../"):
		return "", newError(CodeInvalidPath, codes.InvalidArgument, fmt.Sprintf(
			"WorkspaceRoot %q lies outside the daemon's workspace %q (WithWorkspace, %s)",
			root, c.workspace, EnvWorkspace), field)
	}
	return rel, nil
}

// readStream reads a server stream to its end (so the daemon sees the call
// complete, never cancelled), handing each message to each. An error after
// the last message the caller needs is for the caller to weigh.
func readStream[T any](recv func() (T, error), each func(T)) error {
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

func (c *Client) captureOnce(ctx context.Context, req *pb.CaptureRequest, o *CaptureOptions) (*pb.CaptureDone, error) {
	stream, err := c.Capture(ctx, req)
	if err != nil {
		return nil, err
	}
	var done *pb.CaptureDone
	err = readStream(stream.Recv, func(event *pb.CaptureEvent) {
		if o.OnEvent != nil {
			o.OnEvent(event)
		}
		if p := event.GetProgress(); p != nil && o.OnProgress != nil {
			o.OnProgress(p)
		}
		if d := event.GetDone(); d != nil {
			done = d
		}
	})
	switch {
	case done != nil: // committed, whatever came after
		return done, nil
	case err != nil:
		return nil, err
	}
	return nil, lostReply("the capture")
}

func captureRequest(c *Client, o *CaptureOptions) (*pb.CaptureRequest, error) {
	subdir, err := c.workspaceSubdir(o.WorkspaceRoot, o.WorkspaceSubdir)
	if err != nil {
		return nil, err
	}
	if err := checkSecretNames(o.Secrets, o.SecretNames); err != nil {
		return nil, err
	}
	req := &pb.CaptureRequest{
		ThreadId:        o.ThreadID,
		Policy:          o.Policy,
		Secrets:         o.Secrets,
		SecretNames:     o.SecretNames,
		Artifacts:       o.Artifacts,
		WorkspaceSubdir: subdir,
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
			return nil, invalidArgument(fmt.Sprintf("Conversation[%d] is not a JSON value: %v", i, err),
				map[string]string{"field": "Conversation", "index": fmt.Sprint(i)})
		}
		req.Conversation = append(req.Conversation, string(doc))
	}
	return req, nil
}

// CaptureSandboxCheckpoint saves the daemon's workspace as a new checkpoint at
// the head of the thread. While another writer holds the thread it fails with
// WriterConflictError: skip that capture, the next one saves the same files.
func CaptureSandboxCheckpoint(ctx context.Context, c *Client, o CaptureOptions) (*Captured, error) {
	req, err := captureRequest(c, &o)
	if err != nil {
		return nil, err
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
