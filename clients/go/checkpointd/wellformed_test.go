package checkpointd_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"checkpointd.dev/clients/go/checkpointd"
)

// Invalid UTF-8 in an id is INVALID_ID before anything is sent (the protobuf
// runtime would refuse to marshal it: codes.Internal), on unary calls and
// streams alike; the connection keeps serving.
func TestInvalidUTF8InAnIdIsInvalidID(t *testing.T) {
	client := unixDaemon.dial(t)
	bad := "t-\xff\xfe"
	check := func(what string, err error) {
		t.Helper()
		var invalid checkpointd.InvalidIDError
		if !errors.As(err, &invalid) || status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: want INVALID_ID with codes.InvalidArgument, got %v (%v)", what, err, status.Code(err))
		}
		if !strings.Contains(err.Error(), "UTF-8") {
			t.Fatalf("%s: the message should say why: %v", what, err)
		}
	}
	_, err := checkpointd.GetCheckpoint(ctx(t), client, "c-\xc3\x28", false)
	check("GetCheckpoint", err)
	_, err = checkpointd.CaptureSandboxCheckpoint(ctx(t), client, checkpointd.CaptureOptions{ThreadID: bad})
	check("Capture", err)
	_, err = checkpointd.RestoreSandboxCheckpoint(ctx(t), client, checkpointd.RestoreOptions{ThreadID: bad})
	check("Restore", err)
	if _, err := checkpointd.GetCheckpoint(ctx(t), client, "c-unknown", false); err != nil {
		t.Fatalf("the connection still serves: %v", err)
	}
}
