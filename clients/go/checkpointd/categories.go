package checkpointd

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// ErrorCodes is the whole vocabulary of Code, sorted: every ErrorInfo reason of
// the proto's enum ErrorReason, CodeUnfilledSecrets, and "SANDBOX_SNAPSHOT_" +
// each gRPC status name (the code of a status without ErrorInfo). The
// TypeScript SDK uses the same.
func ErrorCodes() []string {
	out := []string{CodeUnfilledSecrets}
	for number, name := range pb.ErrorReason_name {
		if number != 0 {
			out = append(out, name)
		}
	}
	for _, name := range StatusNames {
		out = append(out, "SANDBOX_SNAPSHOT_"+name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// grpcCode is the gRPC status code of an error of this package, of a gRPC
// status error, or of a context error (codes.OK for nil, codes.Unknown for
// anything else).
func grpcCode(err error) codes.Code {
	var e Error
	switch {
	case err == nil:
		return codes.OK
	case errors.As(err, &e):
		return e.GRPCCode
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return status.Code(err)
}

// IsUnauthenticated: the daemon refused the caller (a missing or wrong token).
func IsUnauthenticated(err error) bool { return grpcCode(err) == codes.Unauthenticated }

// IsUnavailable: the daemon cannot be reached, is starting or draining, or its
// store or bucket is unreachable; the same call may succeed later.
func IsUnavailable(err error) bool { return grpcCode(err) == codes.Unavailable }

// IsDeadlineExceeded: the call's deadline passed (errors.Is(err,
// context.DeadlineExceeded) says the same).
func IsDeadlineExceeded(err error) bool { return grpcCode(err) == codes.DeadlineExceeded }

// IsCancelled: the caller cancelled the call (errors.Is(err, context.Canceled)
// says the same).
func IsCancelled(err error) bool { return grpcCode(err) == codes.Canceled }

// IsNotFound: no such checkpoint, fork source, entry, artifact or service.
func IsNotFound(err error) bool { return grpcCode(err) == codes.NotFound }

// IsConflict: the call lost a race with another writer (WRITER_CONFLICT,
// WRITER_LOST, STALE_HEAD, PARENT_MISMATCH, FILE_CHANGED: gRPC ABORTED) or
// names an id that is taken (DUPLICATE_ID: ALREADY_EXISTS); doing it again,
// after RetryAfter when the error gives one, is the usual answer.
func IsConflict(err error) bool {
	c := grpcCode(err)
	return c == codes.Aborted || c == codes.AlreadyExists
}
