package checkpointd

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
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
	workspace      string
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
	token          *string
	tls            *tls.Config
	tlsFiles       *[3]string
	connectTimeout time.Duration
	waitForDaemon  time.Duration
	retry          RetryPolicy
	deadlines      Deadlines
	workspace      string
	dialOptions    []grpc.DialOption
}

// Option configures Dial.
type Option func(*options)

// WithToken sends "authorization: Bearer <token>" on every call (TCP needs one);
// "" sends none. Without this option Dial reads CHECKPOINTD_TOKEN.
func WithToken(token string) Option { return func(o *options) { o.token = &token } }

// WithTLS dials with TLS (nil config: the system roots). Without this option
// (or WithTLSFiles) Dial reads CHECKPOINTD_TLS_CA, CHECKPOINTD_TLS_CERT and
// CHECKPOINTD_TLS_KEY for a tcp:// address.
//
// The name checked in the daemon's certificate is the address's host, or
// config.ServerName. An IP address is checked against the certificate's IP
// addresses and never sent as the TLS server name (SNI).
func WithTLS(config *tls.Config) Option {
	return func(o *options) {
		if config == nil {
			config = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.tls, o.tlsFiles = config, nil
	}
}

// WithTLSFiles dials with TLS from PEM files, as the checkpointd CLI's
// --tls-ca, --tls-cert and --tls-key flags: ca verifies the daemon ("" for the
// system roots); cert and key (both or neither) are a client certificate for
// mutual TLS.
func WithTLSFiles(ca, cert, key string) Option {
	return func(o *options) { o.tls, o.tlsFiles = nil, &[3]string{ca, cert, key} }
}

// WithConnectTimeout bounds how long Dial (and a capture retry) waits for a
// daemon that answers but is not SERVING yet (default 10 s).
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithWaitForDaemon makes Dial wait up to d for a daemon that does not listen
// yet (a sidecar starting beside the caller). Without it a missing socket or a
// refused connection fails at once.
func WithWaitForDaemon(d time.Duration) Option { return func(o *options) { o.waitForDaemon = d } }

// WithRetry sets the retry policy.
func WithRetry(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithDeadlines sets the deadline of each kind of call whose context has none
// (see Deadlines).
func WithDeadlines(d Deadlines) Option { return func(o *options) { o.deadlines = d } }

// WithWorkspace is where the caller sees the daemon's workspace (its
// --workspace): the folder a WorkspaceRoot option must lie within. Without it,
// CHECKPOINTD_WORKSPACE (what the daemon reads too), else /workspace (the
// daemon's default).
func WithWorkspace(path string) Option { return func(o *options) { o.workspace = path } }

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

func isUnix(address string) bool {
	return strings.HasPrefix(address, "unix:") || strings.HasPrefix(address, "/")
}

// Dial connects to the daemon at address ("unix:///abs/path.sock",
// "unix:/abs/path.sock", "tcp://host:port" or "host:port"; "" reads
// CHECKPOINTD_ADDRESS, else the socket in CHECKPOINTD_DATA_DIR or
// DefaultDataDir, as the checkpointd CLI does) and checks that its health
// check says SERVING and that it accepts the caller.
//
// It fails at once, with the cause in the message, when no daemon listens (a
// missing socket, a refused connection: IsUnavailable), when TLS fails, and
// when the token is missing or wrong (Code CodeUnauthenticated). A daemon that
// answers NOT_SERVING (starting or draining) is waited for up to the connect
// timeout.
func Dial(ctx context.Context, address string, opts ...Option) (*Client, error) {
	o := options{
		connectTimeout: 10 * time.Second,
		retry:          RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second},
	}
	for _, opt := range opts {
		opt(&o)
	}
	address, err := fromEnvironment(address, &o)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	kinds := callKinds{o.deadlines.withDefaults()}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(serviceConfig(o.retry)),
		grpc.WithChainUnaryInterceptor(kinds.unary),
		grpc.WithChainStreamInterceptor(kinds.stream),
	}
	if o.token != nil && *o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{*o.token}))
	}
	conn, err := grpc.NewClient(Target(address), append(dial, o.dialOptions...)...)
	if err != nil {
		return nil, invalidArgument(fmt.Sprintf("address %q: %v", address, err), map[string]string{"address": address})
	}
	client := &Client{
		CheckpointdClient: pb.NewCheckpointdClient(conn),
		Health:            healthpb.NewHealthClient(conn),
		conn:              conn,
		address:           address,
		workspace:         o.workspace,
		retry:             o.retry,
		connectTimeout:    o.connectTimeout,
	}
	if err := client.connect(ctx, &o); err != nil {
		conn.Close()
		return nil, err
	}
	return client, nil
}

// connect waits for SERVING, then asks GetServerInfo: health answers without a
// token (probes cannot send one), GetServerInfo is behind it, so a missing or
// wrong token is reported here.
func (c *Client) connect(ctx context.Context, o *options) error {
	ctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	waitUntil := time.Now().Add(o.waitForDaemon)
	for {
		reply, err := c.Health.Check(ctx, &healthpb.HealthCheckRequest{})
		switch {
		case err == nil && reply.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			_, err = c.GetServerInfo(ctx, &pb.GetServerInfoRequest{})
			if IsUnavailable(err) {
				return c.unreachable(err, o)
			}
			return err
		case err == nil:
			err = fmt.Errorf("it answers %s", reply.GetStatus())
		case ctx.Err() != nil:
			return FromError(ctx.Err())
		case IsUnavailable(err) && time.Now().Before(waitUntil):
			c.conn.ResetConnectBackoff()
		default:
			return c.unreachable(err, o)
		}
		select {
		case <-ctx.Done():
			if o.connectTimeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return newError(CodeUnavailable, codes.Unavailable,
					fmt.Sprintf("the daemon at %s is not SERVING after %s: %v", c.address, o.connectTimeout, err),
					map[string]string{"address": c.address})
			}
			return FromError(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unreachable says why a connection failed, from grpc-go's transport error,
// and what to check.
func (c *Client) unreachable(err error, o *options) error {
	var e Error
	if !errors.As(err, &e) || e.GRPCCode != codes.Unavailable || e.Code != CodeUnavailable {
		return err
	}
	cause := e.Message
	if i := strings.LastIndex(cause, `desc = "`); i >= 0 {
		cause = strings.TrimSuffix(cause[i+len(`desc = "`):], `"`)
	}
	cause = strings.TrimPrefix(cause, "transport: ")
	cause = strings.TrimPrefix(cause, "Error while dialing: ")
	hint := ""
	switch {
	case strings.Contains(cause, "no such file or directory"):
		hint = "; no socket there: is the daemon running? Point CHECKPOINTD_ADDRESS or CHECKPOINTD_DATA_DIR at it"
	case strings.Contains(cause, "connection refused"):
		hint = "; nothing listens there: is the daemon running, on this port?"
	case strings.Contains(cause, "first record does not look like a TLS handshake"):
		hint = "; the daemon does not use TLS there: drop WithTLS / CHECKPOINTD_TLS_CA, or start it with --tls-cert"
	case strings.Contains(cause, "tls:") || strings.Contains(cause, "x509:"):
		hint = "; TLS failed: the daemon's certificate (--tls-cert) must be signed by the CA given " +
			"(CHECKPOINTD_TLS_CA, WithTLS) and name this host"
	case o.tls == nil && !isUnix(c.address):
		hint = "; does the daemon use TLS (--tls-cert)? Then set CHECKPOINTD_TLS_CA (or WithTLS)"
	}
	return newError(CodeUnavailable, codes.Unavailable,
		fmt.Sprintf("cannot reach the daemon at %s: %s%s", c.address, cause, hint),
		map[string]string{"address": c.address})
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying grpc-go connection.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Address is the daemon's address (after the environment was read).
func (c *Client) Address() string { return c.address }

// WaitServing waits (at most timeout) until the daemon answers its health check
// with SERVING; a starting or draining daemon says NOT_SERVING, and an
// unreachable one is dialled again.
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
			return newError(CodeUnavailable, codes.Unavailable,
				fmt.Sprintf("daemon at %s not SERVING after %s: %v", c.address, timeout, last),
				map[string]string{"address": c.address})
		case <-time.After(50 * time.Millisecond):
		}
	}
}
