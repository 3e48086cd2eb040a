package checkpointd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The daemon's stable error codes: the google.rpc.ErrorInfo reason of a failed
// call (the proto's enum ErrorReason, each with the gRPC status it comes with).
const (
	CodeInvalidID                = "SANDBOX_SNAPSHOT_INVALID_ID"
	CodeInvalidEntry             = "SANDBOX_SNAPSHOT_INVALID_ENTRY"
	CodeInvalidArgument          = "SANDBOX_SNAPSHOT_INVALID_ARGUMENT"
	CodeInvalidPath              = "SANDBOX_SNAPSHOT_INVALID_PATH"
	CodeStaleHead                = "SANDBOX_SNAPSHOT_STALE_HEAD"
	CodeParentMismatch           = "SANDBOX_SNAPSHOT_PARENT_MISMATCH"
	CodeWriterConflict           = "SANDBOX_SNAPSHOT_WRITER_CONFLICT"
	CodeWriterLost               = "SANDBOX_SNAPSHOT_WRITER_LOST"
	CodeDuplicateID              = "SANDBOX_SNAPSHOT_DUPLICATE_ID"
	CodeNotHead                  = "SANDBOX_SNAPSHOT_NOT_HEAD"
	CodeUnsupportedEntry         = "SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY"
	CodeMissingCheckpoint        = "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"
	CodeMissingBlob              = "SANDBOX_SNAPSHOT_MISSING_BLOB"
	CodeInvalidBlob              = "SANDBOX_SNAPSHOT_INVALID_BLOB"
	CodeForkSourceNotFound       = "SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND"
	CodeForkSourceThreadMismatch = "SANDBOX_SNAPSHOT_FORK_SOURCE_THREAD_MISMATCH"
	CodeForkDestinationNotEmpty  = "SANDBOX_SNAPSHOT_FORK_DESTINATION_NOT_EMPTY"
	CodeStoreUnavailable         = "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"
	CodeFileChanged              = "SANDBOX_SNAPSHOT_FILE_CHANGED"
	CodeNoSpace                  = "SANDBOX_SNAPSHOT_NO_SPACE"
	CodeNameTooLong              = "SANDBOX_SNAPSHOT_NAME_TOO_LONG"
	CodeCrossDevice              = "SANDBOX_SNAPSHOT_CROSS_DEVICE"
	CodePermissionDenied         = "SANDBOX_SNAPSHOT_PERMISSION_DENIED"
	CodeMissingEntry             = "SANDBOX_SNAPSHOT_MISSING_ENTRY"
	CodeMissingArtifact          = "SANDBOX_SNAPSHOT_MISSING_ARTIFACT"
	CodeDraining                 = "SANDBOX_SNAPSHOT_DRAINING"
	CodeUnauthenticated          = "SANDBOX_SNAPSHOT_UNAUTHENTICATED"
	CodeArtifactNotUploaded      = "SANDBOX_SNAPSHOT_ARTIFACT_NOT_UPLOADED"
	CodeMessageTooLarge          = "SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE"
	CodeInternal                 = "SANDBOX_SNAPSHOT_INTERNAL"
	CodeForbidden                = "SANDBOX_SNAPSHOT_FORBIDDEN"
	CodeUnimplemented            = "SANDBOX_SNAPSHOT_UNIMPLEMENTED"
	CodeUnknownService           = "SANDBOX_SNAPSHOT_UNKNOWN_SERVICE"
)

// CodeUnfilledSecrets is the one code the SDK raises without the daemon: a
// restore with RestoreOptions.RequireSecrets left files holding zeros where the
// capture found a secret it was not given (FAILED_PRECONDITION; metadata
// checkpoint_id, unfilled_secret_count, path).
const CodeUnfilledSecrets = "SANDBOX_SNAPSHOT_UNFILLED_SECRETS"

// The codes of a failed call that carries no ErrorInfo (the daemon is
// unreachable, a deadline passed, the call was cancelled): "SANDBOX_SNAPSHOT_"
// and the gRPC status name as gRPC spells it (CANCELLED, two Ls). The gRPC
// names INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, INTERNAL and
// UNIMPLEMENTED give the codes of the same name above.
const (
	CodeCancelled          = "SANDBOX_SNAPSHOT_CANCELLED"
	CodeUnknown            = "SANDBOX_SNAPSHOT_UNKNOWN"
	CodeDeadlineExceeded   = "SANDBOX_SNAPSHOT_DEADLINE_EXCEEDED"
	CodeNotFound           = "SANDBOX_SNAPSHOT_NOT_FOUND"
	CodeAlreadyExists      = "SANDBOX_SNAPSHOT_ALREADY_EXISTS"
	CodeResourceExhausted  = "SANDBOX_SNAPSHOT_RESOURCE_EXHAUSTED"
	CodeFailedPrecondition = "SANDBOX_SNAPSHOT_FAILED_PRECONDITION"
	CodeAborted            = "SANDBOX_SNAPSHOT_ABORTED"
	CodeOutOfRange         = "SANDBOX_SNAPSHOT_OUT_OF_RANGE"
	CodeUnavailable        = "SANDBOX_SNAPSHOT_UNAVAILABLE"
	CodeDataLoss           = "SANDBOX_SNAPSHOT_DATA_LOSS"
)

// StatusNames are the gRPC status names as gRPC spells them (grpc-go's
// codes.Code.String says "Canceled"; the wire and every other language say
// CANCELLED), by code; OK is no error.
var StatusNames = map[codes.Code]string{
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// codeOfStatus is the code of a status without ErrorInfo.
func codeOfStatus(c codes.Code) string {
	if name, ok := StatusNames[c]; ok {
		return "SANDBOX_SNAPSHOT_" + name
	}
	return CodeUnknown
}

// Details is what every error of this package carries. The typed errors below
// embed it, so `err.Code`, `err.Metadata` and `err.RetryAfter` read the same on all.
type Details struct {
	// Code is the ErrorInfo reason (e.g. CodeWriterConflict). For a status
	// without ErrorInfo (daemon unreachable, deadline, cancel) it is
	// "SANDBOX_SNAPSHOT_" + the gRPC status name, e.g. CodeUnavailable.
	Code    string
	Message string
	// Metadata names the thread, checkpoint, path or key involved.
	Metadata map[string]string
	// RetryAfter is how long the daemon asks the caller to wait (from a
	// google.rpc.RetryInfo detail or the metadata key retry_after_ms); zero when
	// it sent neither.
	RetryAfter time.Duration
	// GRPCCode is the status code; Status the whole status (the cause).
	GRPCCode codes.Code
	Status   *status.Status
}

func (d *Details) Error() string {
	return fmt.Sprintf("%s: %s", d.Code, d.Message)
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (d *Details) GRPCStatus() *status.Status { return d.Status }

// Unwrap gives the gRPC status error, the cause.
func (d *Details) Unwrap() error { return d.Status.Err() }

// Is makes a cancelled call match context.Canceled and one whose deadline
// passed match context.DeadlineExceeded, as errors.Is expects of Go APIs.
func (d *Details) Is(target error) bool {
	switch target {
	case context.Canceled:
		return d.GRPCCode == codes.Canceled
	case context.DeadlineExceeded:
		return d.GRPCCode == codes.DeadlineExceeded
	}
	return false
}

// Error is any error of the daemon; every typed error below also matches it:
//
//	var e checkpointd.Error
//	if errors.As(err, &e) { log.Print(e.Code, e.Metadata) }
type Error struct{ *Details }

// The typed errors, named after the classes of TanStack AI's
// @tanstack/ai-sandbox API. Match them by value or by pointer:
//
//	errors.As(err, &checkpointd.WriterConflictError{})
//	var conflict *checkpointd.WriterConflictError; errors.As(err, &conflict)
type (
	// ConflictError: the head of the thread moved during the capture (SandboxCheckpointConflictError).
	ConflictError       struct{ *Details }
	DuplicateIDError    struct{ *Details }
	InvalidIDError      struct{ *Details }
	InvalidEntryError   struct{ *Details }
	ParentMismatchError struct{ *Details }
	NotHeadError        struct{ *Details }
	// WriterConflictError: another writer holds the thread's lease (SandboxCheckpointWriterConflictError).
	WriterConflictError  struct{ *Details }
	WriterLostError      struct{ *Details }
	InvalidArgumentError struct{ *Details }
	// SnapshotError: capture and restore failures (SandboxSnapshotError); Code says
	// which: CodeMissingBlob, CodeInvalidBlob, CodeMissingCheckpoint, ...
	SnapshotError struct{ *Details }
)

func asKind[T any](self T, d *Details, target any) bool {
	switch t := target.(type) {
	case *Error:
		*t = Error{d}
	case **Error:
		*t = &Error{d}
	case **T:
		v := self
		*t = &v
	default:
		return false
	}
	return true
}

func (e Error) As(target any) bool               { return asKind(e, e.Details, target) }
func (e ConflictError) As(target any) bool       { return asKind(e, e.Details, target) }
func (e DuplicateIDError) As(target any) bool    { return asKind(e, e.Details, target) }
func (e InvalidIDError) As(target any) bool      { return asKind(e, e.Details, target) }
func (e InvalidEntryError) As(target any) bool   { return asKind(e, e.Details, target) }
func (e ParentMismatchError) As(target any) bool { return asKind(e, e.Details, target) }
func (e NotHeadError) As(target any) bool        { return asKind(e, e.Details, target) }
func (e WriterConflictError) As(target any) bool { return asKind(e, e.Details, target) }
func (e WriterLostError) As(target any) bool     { return asKind(e, e.Details, target) }
func (e InvalidArgumentError) As(target any) bool {
	return asKind(e, e.Details, target)
}
func (e SnapshotError) As(target any) bool { return asKind(e, e.Details, target) }

// typed wraps Details in the error type its code names.
func typed(d *Details) error {
	switch d.Code {
	case CodeStaleHead:
		return ConflictError{d}
	case CodeDuplicateID:
		return DuplicateIDError{d}
	case CodeInvalidID:
		return InvalidIDError{d}
	case CodeInvalidEntry:
		return InvalidEntryError{d}
	case CodeParentMismatch:
		return ParentMismatchError{d}
	case CodeNotHead:
		return NotHeadError{d}
	case CodeWriterConflict:
		return WriterConflictError{d}
	case CodeWriterLost:
		return WriterLostError{d}
	case CodeInvalidArgument:
		return InvalidArgumentError{d}
	case CodeUnsupportedEntry, CodeMissingCheckpoint, CodeMissingBlob, CodeInvalidBlob,
		CodeInvalidPath, CodeFileChanged, CodeNoSpace, CodeNameTooLong, CodeCrossDevice,
		CodePermissionDenied, CodeUnfilledSecrets:
		return SnapshotError{d}
	}
	return Error{d}
}

// newError is an error this package raises itself (not the daemon), with the
// status it would have come with.
func newError(code string, grpcCode codes.Code, message string, metadata map[string]string) error {
	if metadata == nil {
		metadata = map[string]string{}
	}
	return typed(&Details{Code: code, Message: message, Metadata: metadata,
		GRPCCode: grpcCode, Status: status.New(grpcCode, message)})
}

// invalidArgument is an argument error the SDK finds before calling the daemon:
// an InvalidArgumentError with codes.InvalidArgument, as the daemon's own.
func invalidArgument(message string, metadata map[string]string) error {
	return newError(CodeInvalidArgument, codes.InvalidArgument, message, metadata)
}

// FromError turns a gRPC error into the typed error its ErrorInfo names. Errors
// of this package, nil and io.EOF are returned as they are; so is an error that
// carries no gRPC status. A bare context error (a call cancelled before it
// started) becomes the CANCELLED or DEADLINE_EXCEEDED error.
func FromError(err error) error {
	if err == nil {
		return nil
	}
	var own interface{ GRPCStatus() *status.Status }
	switch err.(type) {
	case Error, ConflictError, DuplicateIDError, InvalidIDError, InvalidEntryError,
		ParentMismatchError, NotHeadError, WriterConflictError, WriterLostError,
		InvalidArgumentError, SnapshotError:
		return err
	}
	if !errors.As(err, &own) {
		switch {
		case errors.Is(err, context.Canceled):
			return newError(CodeCancelled, codes.Canceled, err.Error(), nil)
		case errors.Is(err, context.DeadlineExceeded):
			return newError(CodeDeadlineExceeded, codes.DeadlineExceeded, err.Error(), nil)
		}
		return err
	}
	st, _ := status.FromError(err)
	d := &Details{Message: st.Message(), Metadata: map[string]string{}, GRPCCode: st.Code(), Status: st}
	for _, detail := range st.Details() {
		switch info := detail.(type) {
		case *errdetails.ErrorInfo:
			if d.Code == "" {
				d.Code = info.GetReason()
				for k, v := range info.GetMetadata() {
					d.Metadata[k] = v
				}
			}
		case *errdetails.RetryInfo:
			if delay := info.GetRetryDelay(); delay != nil && d.RetryAfter == 0 {
				d.RetryAfter = delay.AsDuration()
			}
		}
	}
	if d.RetryAfter == 0 {
		if ms, err := strconv.ParseFloat(d.Metadata["retry_after_ms"], 64); err == nil && ms >= 0 {
			d.RetryAfter = time.Duration(ms * float64(time.Millisecond))
		}
	}
	if d.Code == "" {
		d.Code = codeOfStatus(st.Code())
	}
	return typed(d)
}
