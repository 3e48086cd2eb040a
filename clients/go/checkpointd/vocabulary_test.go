package checkpointd_test

// The SDK's error vocabulary is the one in clients/shared/errors.json, which the
// TypeScript SDK's suite checks too.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"checkpointd.dev/clients/go/checkpointd"
)

type vocabulary struct {
	Prefix     string                       `json:"prefix"`
	GRPCStatus map[string]int               `json:"grpcStatus"`
	Categories map[string][]string          `json:"categories"`
	Reasons    map[string]map[string]string `json:"reasons"`
	SDKReasons map[string]map[string]string `json:"sdkReasons"`
}

func sharedFile(t *testing.T, name string, into any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "shared", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// goTypes: the class TanStack AI's API throws for a code, as this package's type.
var goTypes = map[string]any{
	"SandboxCheckpointError":                checkpointd.Error{},
	"SandboxCheckpointConflictError":        checkpointd.ConflictError{},
	"SandboxCheckpointDuplicateIdError":     checkpointd.DuplicateIDError{},
	"SandboxCheckpointInvalidIdError":       checkpointd.InvalidIDError{},
	"SandboxCheckpointInvalidEntryError":    checkpointd.InvalidEntryError{},
	"SandboxCheckpointParentMismatchError":  checkpointd.ParentMismatchError{},
	"SandboxCheckpointNotHeadError":         checkpointd.NotHeadError{},
	"SandboxCheckpointWriterConflictError":  checkpointd.WriterConflictError{},
	"SandboxCheckpointWriterLostError":      checkpointd.WriterLostError{},
	"SandboxCheckpointInvalidArgumentError": checkpointd.InvalidArgumentError{},
	"SandboxSnapshotError":                  checkpointd.SnapshotError{},
}

// withReason is a status as the daemon sends it: ErrorInfo with the reason.
func withReason(t *testing.T, code codes.Code, reason string) error {
	t.Helper()
	st, err := status.New(code, "m").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "checkpointd"})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestErrorCodesAreTheSharedVocabulary(t *testing.T) {
	var v vocabulary
	sharedFile(t, "errors.json", &v)
	var want []string
	for name := range v.GRPCStatus {
		if name != "OK" {
			want = append(want, v.Prefix+name)
		}
	}
	for code := range v.Reasons {
		want = append(want, code)
	}
	for code := range v.SDKReasons {
		want = append(want, code)
	}
	slices.Sort(want)
	want = slices.Compact(want)
	if got := checkpointd.ErrorCodes(); !slices.Equal(got, want) {
		t.Fatalf("ErrorCodes()\n got %v\nwant %v", got, want)
	}
	for name, number := range v.GRPCStatus {
		if name != "OK" && checkpointd.StatusNames[codes.Code(number)] != name {
			t.Errorf("StatusNames[%d] = %q, errors.json says %q", number, checkpointd.StatusNames[codes.Code(number)], name)
		}
	}
	// The package's constants are words of the vocabulary.
	for _, code := range []string{checkpointd.CodeCancelled, checkpointd.CodeDeadlineExceeded, checkpointd.CodeUnavailable,
		checkpointd.CodeUnknown, checkpointd.CodeNotFound, checkpointd.CodeAlreadyExists, checkpointd.CodeResourceExhausted,
		checkpointd.CodeFailedPrecondition, checkpointd.CodeAborted, checkpointd.CodeOutOfRange, checkpointd.CodeDataLoss,
		checkpointd.CodeUnfilledSecrets, checkpointd.CodeWriterConflict, checkpointd.CodeMissingCheckpoint,
		checkpointd.CodeForkDestinationNotEmpty, checkpointd.CodeUnknownService, checkpointd.CodeInvalidPath} {
		if !slices.Contains(want, code) {
			t.Errorf("%s is not in errors.json", code)
		}
	}
	if checkpointd.CodeCancelled != "SANDBOX_SNAPSHOT_CANCELLED" {
		t.Fatal("CANCELLED is spelled as gRPC spells it")
	}
}

func TestEachCodeIsTheClassTheSharedVocabularyNames(t *testing.T) {
	var v vocabulary
	sharedFile(t, "errors.json", &v)
	all := map[string]map[string]string{}
	for code, r := range v.Reasons {
		all[code] = r
	}
	for code, r := range v.SDKReasons {
		all[code] = r
	}
	for code, r := range all {
		want, ok := goTypes[r["class"]]
		if !ok {
			t.Errorf("%s: class %s has no Go type", code, r["class"])
			continue
		}
		grpcCode := codes.Code(v.GRPCStatus[r["status"]])
		err := checkpointd.FromError(withReason(t, grpcCode, code))
		if reflect.TypeOf(err) != reflect.TypeOf(want) {
			t.Errorf("%s: %T, want %T", code, err, want)
		}
		var base checkpointd.Error
		if !errors.As(err, &base) || base.Code != code || base.GRPCCode != grpcCode || status.Code(err) != grpcCode {
			t.Errorf("%s: %+v", code, base.Details)
		}
	}
	// A status without ErrorInfo: prefix + the gRPC name.
	for name, number := range v.GRPCStatus {
		if name == "OK" {
			continue
		}
		var e checkpointd.Error
		if err := checkpointd.FromError(status.Error(codes.Code(number), "m")); !errors.As(err, &e) || e.Code != v.Prefix+name {
			t.Errorf("status %s: %v", name, err)
		}
	}
}

func TestCategoriesFollowTheStatusAlone(t *testing.T) {
	var v vocabulary
	sharedFile(t, "errors.json", &v)
	predicates := map[string]func(error) bool{
		"cancelled":       checkpointd.IsCancelled,
		"deadline":        checkpointd.IsDeadlineExceeded,
		"unauthenticated": checkpointd.IsUnauthenticated,
		"unavailable":     checkpointd.IsUnavailable,
		"not_found":       checkpointd.IsNotFound,
		"conflict":        checkpointd.IsConflict,
	}
	if len(predicates) != len(v.Categories) {
		t.Fatalf("categories %v", v.Categories)
	}
	for category, names := range v.Categories {
		is := predicates[category]
		for name, number := range v.GRPCStatus {
			if name == "OK" {
				continue
			}
			want := slices.Contains(names, name)
			bare := status.Error(codes.Code(number), "m")
			typed := checkpointd.FromError(withReason(t, codes.Code(number), "ANY_REASON"))
			if is(bare) != want || is(typed) != want || is(fmt.Errorf("wrapped: %w", typed)) != want {
				t.Errorf("%s(%s) != %v", category, name, want)
			}
		}
	}
	// A context error is its category too, before any call.
	if !checkpointd.IsCancelled(context.Canceled) || !checkpointd.IsDeadlineExceeded(context.DeadlineExceeded) {
		t.Fatal("context errors")
	}
	cancelled := checkpointd.FromError(status.Error(codes.Canceled, "context canceled"))
	late := checkpointd.FromError(status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
	if !errors.Is(cancelled, context.Canceled) || errors.Is(cancelled, context.DeadlineExceeded) ||
		!errors.Is(late, context.DeadlineExceeded) || errors.Is(late, context.Canceled) {
		t.Fatal("errors.Is with the context errors")
	}
}
