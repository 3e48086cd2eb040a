// Package checkpointd is the Go client of the checkpointd daemon, in the seeds'
// words: Dial, then CaptureSandboxCheckpoint / RestoreSandboxCheckpoint /
// DeleteCheckpoints / SweepSandboxBlobs, with typed errors (WriterConflictError,
// SnapshotError with Code == CodeMissingBlob, ...) decoded from the status's
// google.rpc.ErrorInfo.
//
//	client, err := checkpointd.Dial(ctx, "unix:///run/checkpointd/checkpointd.sock")
//	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client, checkpointd.CaptureOptions{ThreadID: "t1"})
//	if errors.As(err, &checkpointd.WriterConflictError{}) { /* skip: the next capture saves the same files */ }
//
// Every RPC of the contract is a method of Client (the generated
// checkpointdv1.CheckpointdClient, embedded), and its errors are the typed
// errors too. Read-only RPCs are retried by grpc-go on UNAVAILABLE (a service
// config retry policy); CaptureSandboxCheckpoint sends a request id (random
// unless given) and retries with the same id after a lost reply, so the daemon
// returns the checkpoint the lost attempt committed instead of making a second.
package checkpointd

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// Client is a connection to the daemon. Every RPC is a method (from the embedded
// generated client) whose errors are this package's typed errors.
type Client struct {
	pb.CheckpointdClient
	// Health is grpc.health.v1 (Check, Watch).
	Health healthpb.HealthClient

	conn           *grpc.ClientConn
	address        string
	retry          RetryPolicy
	connectTimeout time.Duration
}

// RetryPolicy bounds the retries of a capture whose reply was lost (and, through
// grpc-go's service config, of read-only RPCs on UNAVAILABLE).
type RetryPolicy struct {
	MaxAttempts    int           // attempts in all, the first included (default 5)
	InitialBackoff time.Duration // doubled on each retry (default 100 ms)
	MaxBackoff     time.Duration // (default 2 s)
}

type options struct {
	token          string
	tls            *tls.Config
	connectTimeout time.Duration
	retry          RetryPolicy
	dialOptions    []grpc.DialOption
}

// Option configures Dial.
type Option func(*options)

// WithToken sends "authorization: Bearer <token>" on every call (TCP needs one).
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLS dials with TLS (nil config: the system roots).
func WithTLS(config *tls.Config) Option {
	return func(o *options) {
		if config == nil {
			config = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.tls = config
	}
}

// WithConnectTimeout bounds how long Dial (and a capture retry) waits for the
// daemon to be SERVING (default 10 s).
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithRetry sets the retry policy.
func WithRetry(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithDialOptions adds grpc-go dial options.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

type bearer struct{ token string }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// The daemon takes a token over plain TCP (inside the sandbox's network).
func (bearer) RequireTransportSecurity() bool { return false }

var readOnlyMethods = []string{
	"GetCheckpoint", "ListCheckpoints", "GetHead", "ListEntries", "Diff",
	"ReadFile", "ReadArtifact", "GetServerInfo",
}

func serviceConfig(p RetryPolicy) string {
	names := make([]map[string]string, 0, len(readOnlyMethods))
	for _, m := range readOnlyMethods {
		names = append(names, map[string]string{"service": "checkpointd.v1.Checkpointd", "method": m})
	}
	config, _ := json.Marshal(map[string]any{
		"methodConfig": []any{map[string]any{
			"name": names,
			"retryPolicy": map[string]any{
				"maxAttempts":          min(p.MaxAttempts, 5),
				"initialBackoff":       fmt.Sprintf("%.3fs", p.InitialBackoff.Seconds()),
				"maxBackoff":           fmt.Sprintf("%.3fs", p.MaxBackoff.Seconds()),
				"backoffMultiplier":    2,
				"retryableStatusCodes": []string{"UNAVAILABLE"},
			},
		}},
	})
	return string(config)
}

// Target is grpc-go's form of an address: "unix:///abs/path.sock" and
// "unix:/abs/path.sock" as they are, "tcp://host:port" as "host:port".
func Target(address string) string {
	switch {
	case strings.HasPrefix(address, "tcp://"):
		return strings.TrimPrefix(address, "tcp://")
	case strings.HasPrefix(address, "/"):
		return "unix://" + address
	}
	return address
}

func typedUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return FromError(invoker(ctx, method, req, reply, cc, opts...))
}

type typedStream struct{ grpc.ClientStream }

func (s typedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if errors.Is(err, io.EOF) {
		return err
	}
	return FromError(err)
}

func (s typedStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if errors.Is(err, io.EOF) {
		return err // the real status comes from RecvMsg
	}
	return FromError(err)
}

func (s typedStream) CloseSend() error { return FromError(s.ClientStream.CloseSend()) }

func typedStreamer(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, FromError(err)
	}
	return typedStream{stream}, nil
}

// Dial connects to the daemon at address ("unix:///abs/path.sock",
// "unix:/abs/path.sock", "tcp://host:port" or "host:port") and waits until its
// health check says SERVING. A missing or wrong token fails at once with an
// Error whose Code is CodeUnauthenticated.
func Dial(ctx context.Context, address string, opts ...Option) (*Client, error) {
	o := options{
		connectTimeout: 10 * time.Second,
		retry:          RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second},
	}
	for _, opt := range opts {
		opt(&o)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(serviceConfig(o.retry)),
		grpc.WithChainUnaryInterceptor(typedUnary),
		grpc.WithChainStreamInterceptor(typedStreamer),
	}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{o.token}))
	}
	conn, err := grpc.NewClient(Target(address), append(dial, o.dialOptions...)...)
	if err != nil {
		return nil, err
	}
	client := &Client{
		CheckpointdClient: pb.NewCheckpointdClient(conn),
		Health:            healthpb.NewHealthClient(conn),
		conn:              conn,
		address:           address,
		retry:             o.retry,
		connectTimeout:    o.connectTimeout,
	}
	if err := client.WaitServing(ctx, o.connectTimeout); err != nil {
		conn.Close()
		return nil, err
	}
	// Health answers without a token (probes cannot send one); GetServerInfo is
	// behind it, so a missing or wrong token is reported here.
	infoCtx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	if _, err := client.GetServerInfo(infoCtx, &pb.GetServerInfoRequest{}); err != nil {
		conn.Close()
		return nil, err
	}
	return client, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying grpc-go connection.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// WaitServing waits (at most timeout) until the daemon answers its health check
// with SERVING; a starting or draining daemon says NOT_SERVING.
func (c *Client) WaitServing(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		reply, err := c.Health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && reply.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if status.Code(err) == codes.Unauthenticated {
			return err
		}
		if err == nil {
			err = fmt.Errorf("daemon at %s is %s", c.address, reply.GetStatus())
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return Error{&Details{
				Code:     "SANDBOX_SNAPSHOT_UNAVAILABLE",
				Message:  fmt.Sprintf("daemon at %s not SERVING after %s: %v", c.address, timeout, last),
				Metadata: map[string]string{"address": c.address},
				GRPCCode: codes.Unavailable,
				Status:   status.New(codes.Unavailable, last.Error()),
			}}
		case <-time.After(50 * time.Millisecond):
		}
	}
}
