// Package checkpointd is the Go client of the checkpointd daemon, which
// captures an AI agent's sandbox workspace into checkpoints and restores them.
// Its functions and errors follow TanStack AI's @tanstack/ai-sandbox API
// (captureSandboxCheckpoint, restoreSandboxCheckpoint, deleteCheckpoints,
// sweepSandboxBlobs, the store's get, list and deleteHead):
//
//	client, err := checkpointd.Dial(ctx, "") // CHECKPOINTD_ADDRESS, else the default socket
//	if err != nil {
//		return err
//	}
//	defer client.Close()
//	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx, client, checkpointd.RestoreOptions{ThreadID: "t1"})
//	// restored == nil: the thread has no checkpoint yet
//	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client, checkpointd.CaptureOptions{ThreadID: "t1"})
//	if errors.As(err, &checkpointd.WriterConflictError{}) {
//		// another capture of the thread runs: skip, the next one saves the same files
//	}
//
// # Connecting
//
// Dial reads the environment as the checkpointd CLI does (CHECKPOINTD_ADDRESS,
// CHECKPOINTD_DATA_DIR, CHECKPOINTD_TOKEN, CHECKPOINTD_TLS_CA / _CERT / _KEY;
// options win) and fails at once, saying why, when no daemon listens, TLS fails
// or the token is wrong. Every call whose context has no deadline gets one by
// its kind (Deadlines). Every RPC of the daemon is also a method of Client (the
// generated checkpointdv1.CheckpointdClient, embedded).
//
// # Errors
//
// Every error of a call is one of this package's typed errors, decoded from
// the status's google.rpc.ErrorInfo: match a class with errors.As
// (WriterConflictError, ConflictError, SnapshotError, ..., or Error for any),
// read its Code (one of ErrorCodes: the daemon's reason, or
// "SANDBOX_SNAPSHOT_" + the gRPC status name such as CodeCancelled), or ask a
// category: IsUnauthenticated, IsUnavailable, IsDeadlineExceeded, IsCancelled,
// IsNotFound, IsConflict. A cancelled call matches errors.Is(err,
// context.Canceled), one past its deadline errors.Is(err,
// context.DeadlineExceeded); status.Code(err) still works. Arguments the
// package refuses before calling are an InvalidArgumentError with
// codes.InvalidArgument, as the daemon's own.
//
// # Retries
//
// Read-only RPCs are retried by grpc-go on UNAVAILABLE (a service config retry
// policy). CaptureSandboxCheckpoint sends a request id (random unless given)
// and retries with the same id after a lost reply, so the daemon returns the
// checkpoint the lost attempt committed instead of making a second. A
// WRITER_CONFLICT fails at once.
//
// Every stream is read to its end, so the daemon sees each call that
// succeeded complete.
package checkpointd
