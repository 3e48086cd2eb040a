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
	// DiscardLiveChanges skips saving the live changes the restore overwrites
	// to the thread's stash (which UndoRestore brings back): they are lost.
	DiscardLiveChanges bool
	// Record appends a checkpoint (reason "restore") when the checkpoint
	// restored is not the head, so the head describes the workspace; by
	// default the head never moves.
	Record bool
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
	// SavedBeforeRestore is the stash entry the live tree was saved to before
	// it was changed (nil when nothing needed saving); UndoRestore restores it.
	SavedBeforeRestore *pb.SavedBeforeRestore
	// Recorded is the checkpoint Record appended (the thread's new head).
	Recorded *pb.CheckpointSummary
	Duration time.Duration
}

// RestorePlan is a dry run's plan: the counts, and the paths it would write
// and delete, and those among them whose live changes it would stash first.
type RestorePlan struct {
	*pb.RestorePlan
	Written []string
	Deleted []string
	Stashed []string
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

// checkSecretNames: names, when given, name each secret.
func checkSecretNames(secrets [][]byte, names []string) error {
	if len(names) > 0 && len(names) != len(secrets) {
		return invalidArgument(fmt.Sprintf("SecretNames has %d names for %d Secrets", len(names), len(secrets)),
			map[string]string{"field": "SecretNames"})
	}
	return nil
}

func restoreRequest(c *Client, o *RestoreOptions) (*pb.RestoreRequest, error) {
	subdir, err := c.workspaceSubdir(o.WorkspaceRoot, o.WorkspaceSubdir)
	if err != nil {
		return nil, err
	}
	if err := checkSecretNames(o.Secrets, o.SecretNames); err != nil {
		return nil, err
	}
	req := &pb.RestoreRequest{ThreadId: o.ThreadID, Policy: o.Policy, WorkspaceSubdir: subdir,
		DryRun: o.DryRun, Secrets: o.Secrets, SecretNames: o.SecretNames,
		DiscardLiveChanges: o.DiscardLiveChanges, Record: o.Record}
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
	return readRestore(stream, &restoreReading{dryRun: o.DryRun, requireSecrets: o.RequireSecrets,
		onProgress: o.OnProgress, onEvent: o.OnEvent})
}

// restoreReading: what reading a Restore's or an Undo's events needs.
type restoreReading struct {
	dryRun, requireSecrets bool
	onProgress             func(*pb.Progress)
	onEvent                func(*pb.RestoreEvent)
}

// readRestore reads a Restore's or an Undo's events to their end into the result.
func readRestore(stream interface {
	Recv() (*pb.RestoreEvent, error)
}, r *restoreReading) (*Restored, error) {
	var done *pb.RestoreDone
	plan := &RestorePlan{}
	err := readStream(stream.Recv, func(event *pb.RestoreEvent) {
		if r.onEvent != nil {
			r.onEvent(event)
		}
		if p := event.GetProgress(); p != nil && r.onProgress != nil {
			r.onProgress(p)
		}
		if paths := event.GetPlanPaths(); paths != nil {
			plan.Written = append(plan.Written, paths.GetWritten()...)
			plan.Deleted = append(plan.Deleted, paths.GetDeleted()...)
			plan.Stashed = append(plan.Stashed, paths.GetStashed()...)
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
	case done.GetCheckpoint() == nil || !(done.GetRestored() || r.dryRun):
		return nil, nil // the thread has no checkpoint
	}
	out := &Restored{CheckpointSummary: done.GetCheckpoint(),
		UnfilledSecretPaths: done.GetUnfilledSecretPaths(), UnfilledSecretCount: done.GetUnfilledSecretCount(),
		SavedBeforeRestore: done.GetSavedBeforeRestore(), Recorded: done.GetRecorded(),
		Duration: time.Duration(done.GetDurationMs()) * time.Millisecond}
	if r.dryRun {
		plan.RestorePlan = done.GetPlan()
		out.Plan = plan
	}
	if r.requireSecrets && out.UnfilledSecretCount > 0 {
		return out, unfilledSecrets(out)
	}
	return out, nil
}

// UndoOptions: which thread's last restore to undo, and how.
type UndoOptions struct {
	ThreadID string
	// WorkspaceRoot or WorkspaceSubdir (see RestoreOptions); neither: the
	// folder the stash entry was taken from.
	WorkspaceRoot   string
	WorkspaceSubdir string
	Secrets         [][]byte
	SecretNames     []string
	DryRun          bool
	Record          bool
	RequireSecrets  bool
	OnProgress      func(*pb.Progress)
	OnEvent         func(*pb.RestoreEvent)
}

// UndoRestore undoes the thread's last restore: it restores the newest entry
// of the thread's stash (the live tree a restore replaced), saving what it
// overwrites to the stash first, so an undo of an undo is a redo. The result
// is the stash entry restored. An empty stash is a SnapshotError with Code
// CodeMissingCheckpoint (IsNotFound).
func UndoRestore(ctx context.Context, c *Client, o UndoOptions) (*Restored, error) {
	subdir, err := c.workspaceSubdir(o.WorkspaceRoot, o.WorkspaceSubdir)
	if err != nil {
		return nil, err
	}
	if err := checkSecretNames(o.Secrets, o.SecretNames); err != nil {
		return nil, err
	}
	stream, err := c.Undo(ctx, &pb.UndoRequest{ThreadId: o.ThreadID, WorkspaceSubdir: subdir, DryRun: o.DryRun,
		Secrets: o.Secrets, SecretNames: o.SecretNames, Record: o.Record})
	if err != nil {
		return nil, err
	}
	return readRestore(stream, &restoreReading{dryRun: o.DryRun, requireSecrets: o.RequireSecrets,
		onProgress: o.OnProgress, onEvent: o.OnEvent})
}
