package checkpointd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// RestoreOptions are the options of restoreSandboxCheckpoint in TanStack AI's
// @tanstack/ai-sandbox API, and the daemon's own.
type RestoreOptions struct {
	ThreadID string
	// CheckpointID restores that checkpoint of the thread instead of the newest.
	CheckpointID string
	// Policy: unset, the one the checkpoint was captured with.
	Policy *pb.Policy
	// WorkspaceRoot is the folder to restore into as the caller sees it (see
	// CaptureOptions.WorkspaceRoot); WorkspaceSubdir the same relative to the
	// daemon's workspace. Neither: the folder the checkpoint was captured from.
	WorkspaceRoot   string
	WorkspaceSubdir string
	// Secrets are written back where the capture zeroed them: by name when
	// SecretNames (parallel to Secrets) is given, else by position.
	Secrets     [][]byte
	SecretNames []string
	// DryRun plans only: nothing is fetched or changed, and the result's Plan
	// says what a restore would do now. It takes no writer lease.
	DryRun bool
	// RequireSecrets makes a restore that left files zeroed where the capture
	// found a secret (one not given in Secrets) fail with a SnapshotError whose
	// Code is CodeUnfilledSecrets, returned beside the result: the files are
	// restored, give the secrets and restore again.
	RequireSecrets bool
	// OnProgress sees every progress event; OnEvent every event.
	OnProgress func(*pb.Progress)
	OnEvent    func(*pb.RestoreEvent)
}

// Restored is the restored (or, for a dry run, planned) checkpoint's summary,
// with what the restore left to do.
type Restored struct {
	*pb.CheckpointSummary
	// Plan is set for a dry run only: what a restore would do now.
	Plan *RestorePlan
	// UnfilledSecretPaths are files that hold zeros where the capture found a
	// secret not given to this restore (at most the first 10,000);
	// UnfilledSecretCount counts them all. Give the secrets and restore again
	// to fill them.
	UnfilledSecretPaths []string
	UnfilledSecretCount uint64
	Duration            time.Duration
}

// RestorePlan is a dry run's plan: the counts, and the paths it would write
// and delete.
type RestorePlan struct {
	*pb.RestorePlan
	Written []string
	Deleted []string
}

func unfilledSecrets(r *Restored) error {
	shown := strings.Join(r.UnfilledSecretPaths[:min(len(r.UnfilledSecretPaths), 5)], ", ")
	if more := r.UnfilledSecretCount - uint64(min(len(r.UnfilledSecretPaths), 5)); more > 0 {
		shown += fmt.Sprintf(" and %d more", more)
	}
	message := fmt.Sprintf("restored %s, but %d files hold zeros where the capture found a secret "+
		"this restore was not given (%s); give Secrets (and SecretNames) and restore again",
		r.Id, r.UnfilledSecretCount, shown)
	metadata := map[string]string{"thread_id": r.ThreadId, "checkpoint_id": r.Id,
		"unfilled_secret_count": fmt.Sprint(r.UnfilledSecretCount)}
	if len(r.UnfilledSecretPaths) > 0 {
		metadata["path"] = r.UnfilledSecretPaths[0]
	}
	return newError(CodeUnfilledSecrets, codes.FailedPrecondition, message, metadata)
}

func restoreRequest(c *Client, o *RestoreOptions) (*pb.RestoreRequest, error) {
	subdir, err := c.workspaceSubdir(o.WorkspaceRoot, o.WorkspaceSubdir)
	if err != nil {
		return nil, err
	}
	if len(o.SecretNames) > 0 && len(o.SecretNames) != len(o.Secrets) {
		return nil, invalidArgument(fmt.Sprintf("SecretNames has %d names for %d Secrets",
			len(o.SecretNames), len(o.Secrets)), map[string]string{"field": "SecretNames"})
	}
	req := &pb.RestoreRequest{ThreadId: o.ThreadID, Policy: o.Policy, WorkspaceSubdir: subdir,
		DryRun: o.DryRun, Secrets: o.Secrets, SecretNames: o.SecretNames}
	if o.CheckpointID != "" {
		req.CheckpointId = proto.String(o.CheckpointID)
	}
	return req, nil
}

// RestoreSandboxCheckpoint restores the newest (or the given) checkpoint of the
// thread into the daemon's workspace. It returns nil, nil when the thread has no
// checkpoint (the workspace stays as it is); an id not on the thread is a
// SnapshotError with Code CodeMissingCheckpoint.
//
// With DryRun nothing changes and the result's Plan says what would. With
// RequireSecrets, files left zeroed for want of a secret make the error a
// SnapshotError with Code CodeUnfilledSecrets, returned with the result.
func RestoreSandboxCheckpoint(ctx context.Context, c *Client, o RestoreOptions) (*Restored, error) {
	req, err := restoreRequest(c, &o)
	if err != nil {
		return nil, err
	}
	stream, err := c.Restore(ctx, req)
	if err != nil {
		return nil, err
	}
	var done *pb.RestoreDone
	var written, deleted []string
	err = readStream(stream.Recv, func(event *pb.RestoreEvent) {
		if o.OnEvent != nil {
			o.OnEvent(event)
		}
		if p := event.GetProgress(); p != nil && o.OnProgress != nil {
			o.OnProgress(p)
		}
		if paths := event.GetPlanPaths(); paths != nil {
			written = append(written, paths.GetWritten()...)
			deleted = append(deleted, paths.GetDeleted()...)
		}
		if d := event.GetDone(); d != nil {
			done = d
		}
	})
	switch {
	case done == nil && err != nil:
		return nil, err
	case done == nil:
		return nil, lostReply("the restore")
	case done.GetCheckpoint() == nil || !(done.GetRestored() || o.DryRun):
		return nil, nil // the thread has no checkpoint
	}
	out := &Restored{CheckpointSummary: done.GetCheckpoint(),
		UnfilledSecretPaths: done.GetUnfilledSecretPaths(), UnfilledSecretCount: done.GetUnfilledSecretCount(),
		Duration: time.Duration(done.GetDurationMs()) * time.Millisecond}
	if o.DryRun {
		out.Plan = &RestorePlan{RestorePlan: done.GetPlan(), Written: written, Deleted: deleted}
	}
	if o.RequireSecrets && out.UnfilledSecretCount > 0 {
		return out, unfilledSecrets(out)
	}
	return out, nil
}
