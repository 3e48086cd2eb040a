package checkpointd

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The daemon's stable error codes (the ErrorInfo reason of a failed call).
const (
	CodeStaleHead          = "SANDBOX_SNAPSHOT_STALE_HEAD"
	CodeDuplicateID        = "SANDBOX_SNAPSHOT_DUPLICATE_ID"
	CodeInvalidID          = "SANDBOX_SNAPSHOT_INVALID_ID"
	CodeInvalidEntry       = "SANDBOX_SNAPSHOT_INVALID_ENTRY"
	CodeParentMismatch     = "SANDBOX_SNAPSHOT_PARENT_MISMATCH"
	CodeNotHead            = "SANDBOX_SNAPSHOT_NOT_HEAD"
	CodeWriterConflict     = "SANDBOX_SNAPSHOT_WRITER_CONFLICT"
	CodeWriterLost         = "SANDBOX_SNAPSHOT_WRITER_LOST"
	CodeInvalidArgument    = "SANDBOX_SNAPSHOT_INVALID_ARGUMENT"
	CodeUnsupportedEntry   = "SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY"
	CodeMissingCheckpoint  = "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"
	CodeMissingBlob        = "SANDBOX_SNAPSHOT_MISSING_BLOB"
	CodeInvalidBlob        = "SANDBOX_SNAPSHOT_INVALID_BLOB"
	CodeInvalidPath        = "SANDBOX_SNAPSHOT_INVALID_PATH"
	CodeFileChanged        = "SANDBOX_SNAPSHOT_FILE_CHANGED"
	CodeStoreUnavailable   = "SANDBOX_SNAPSHOT_STORE_UNAVAILABLE"
	CodeUnauthenticated    = "SANDBOX_SNAPSHOT_UNAUTHENTICATED"
	CodeForkSourceNotFound = "SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND"
	CodeNoSpace            = "SANDBOX_SNAPSHOT_NO_SPACE"
	CodeNameTooLong        = "SANDBOX_SNAPSHOT_NAME_TOO_LONG"
	CodeCrossDevice        = "SANDBOX_SNAPSHOT_CROSS_DEVICE"
	CodePermissionDenied   = "SANDBOX_SNAPSHOT_PERMISSION_DENIED"
)

// Details is what every error of this package carries. The typed errors below
// embed it, so `err.Code`, `err.Metadata` and `err.RetryAfter` read the same on all.
type Details struct {
	// Code is the ErrorInfo reason (e.g. CodeWriterConflict). For a status
	// without ErrorInfo (daemon unreachable, deadline, cancel) it is
	// "SANDBOX_SNAPSHOT_" + the gRPC code name, e.g. "SANDBOX_SNAPSHOT_UNAVAILABLE".
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

// Error is any error of the daemon; every typed error below also matches it:
//
//	var e checkpointd.Error
//	if errors.As(err, &e) { log.Print(e.Code, e.Metadata) }
type Error struct{ *Details }

// The typed errors, named after the seeds' classes. Match them by value or by pointer:
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
		CodePermissionDenied:
		return SnapshotError{d}
	}
	return Error{d}
}

// upperSnake turns "DeadlineExceeded" into "DEADLINE_EXCEEDED".
func upperSnake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// FromError turns a gRPC error into the typed error its ErrorInfo names. Errors
// of this package, nil and io.EOF are returned as they are; so is an error that
// carries no gRPC status.
func FromError(err error) error {
	if err == nil {
		return nil
	}
	switch err.(type) {
	case Error, ConflictError, DuplicateIDError, InvalidIDError, InvalidEntryError,
		ParentMismatchError, NotHeadError, WriterConflictError, WriterLostError,
		InvalidArgumentError, SnapshotError:
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
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
		d.Code = "SANDBOX_SNAPSHOT_" + upperSnake(st.Code().String())
	}
	return typed(d)
}
