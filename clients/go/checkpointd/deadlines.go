package checkpointd

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// Deadlines bounds each kind of call whose context has no deadline of its own
// (a context's deadline always wins). Zero picks the default; a negative
// duration sets none.
type Deadlines struct {
	// Unary calls: GetCheckpoint, ListCheckpoints, Fork, Prune, ... (default 30 s).
	Unary time.Duration
	// Streams that read: ListEntries, Diff, ReadFile, ReadArtifact (default 10 min).
	Read time.Duration
	// Long work: Capture, Restore, SweepBlobs, Check, UploadArtifact (default 1 h).
	Work time.Duration
}

// DefaultDeadlines are the deadlines Dial sets when WithDeadlines does not.
var DefaultDeadlines = Deadlines{Unary: 30 * time.Second, Read: 10 * time.Minute, Work: time.Hour}

func (d Deadlines) withDefaults() Deadlines {
	pick := func(v, def time.Duration) time.Duration {
		if v == 0 {
			return def
		}
		return v
	}
	return Deadlines{
		Unary: pick(d.Unary, DefaultDeadlines.Unary),
		Read:  pick(d.Read, DefaultDeadlines.Read),
		Work:  pick(d.Work, DefaultDeadlines.Work),
	}
}

var workMethods = map[string]bool{
	"Capture": true, "Restore": true, "SweepBlobs": true, "Check": true, "UploadArtifact": true,
}

// callKinds applies Deadlines and turns every error into the typed error.
type callKinds struct{ deadlines Deadlines }

func withDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, has := ctx.Deadline(); has || d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

func (k callKinds) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := checkWellFormed(req); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, k.deadlines.Unary)
	defer cancel()
	return FromError(invoker(ctx, method, req, reply, cc, opts...))
}

func (k callKinds) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	name := method[strings.LastIndex(method, "/")+1:]
	limit := k.deadlines.Read
	switch {
	case workMethods[name]:
		limit = k.deadlines.Work
	case name == "Watch": // grpc.health.v1.Health/Watch lasts as long as the caller wants
		limit = 0
	}
	ctx, cancel := withDeadline(ctx, limit)
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, FromError(err)
	}
	return &typedStream{ClientStream: stream, cancel: cancel}, nil
}

// typedStream turns a stream's errors into the typed errors and releases its
// deadline's timer once the stream has ended.
type typedStream struct {
	grpc.ClientStream
	cancel context.CancelFunc
}

func (s *typedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		defer s.cancel()
	}
	if errors.Is(err, io.EOF) {
		return err
	}
	return FromError(err)
}

func (s *typedStream) SendMsg(m any) error {
	if err := checkWellFormed(m); err != nil {
		return err
	}
	err := s.ClientStream.SendMsg(m)
	if errors.Is(err, io.EOF) {
		return err // the real status comes from RecvMsg
	}
	return FromError(err)
}

func (s *typedStream) CloseSend() error { return FromError(s.ClientStream.CloseSend()) }
