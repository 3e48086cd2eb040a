package checkpointd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

// dialFails dials and expects an UNAVAILABLE error within a second whose
// message names the address and holds each of the words.
func dialFails(t *testing.T, address string, words []string, opts ...checkpointd.Option) {
	t.Helper()
	started := time.Now()
	client, err := checkpointd.Dial(context.Background(), address, opts...)
	took := time.Since(started)
	if err == nil {
		client.Close()
		t.Fatalf("%s: dialled", address)
	}
	if took > time.Second {
		t.Fatalf("%s: failed after %s, not at once: %v", address, took, err)
	}
	var e checkpointd.Error
	if !errors.As(err, &e) || !checkpointd.IsUnavailable(err) || e.Code != checkpointd.CodeUnavailable ||
		!strings.Contains(e.Message, address) {
		t.Fatalf("%s: %T %v", address, err, err)
	}
	for _, word := range words {
		if !strings.Contains(e.Message, word) {
			t.Fatalf("%s: %q does not say %q", address, e.Message, word)
		}
	}
	t.Logf("%s in %s: %v", address, took.Round(time.Millisecond), err)
}

func TestDialFailsAtOnceSayingWhy(t *testing.T) {
	missing := "unix://" + filepath.Join(t.TempDir(), "checkpointd.sock")
	dialFails(t, missing, []string{"no such file or directory", "CHECKPOINTD_ADDRESS"})
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	dialFails(t, fmt.Sprintf("tcp://127.0.0.1:%d", port), []string{"connection refused"})

	// TLS to a daemon without TLS.
	dialFails(t, tcpDaemon.address, []string{"tls: first record does not look like a TLS handshake", "--tls-cert"},
		checkpointd.WithTLS(nil), checkpointd.WithToken(tcpToken))

	p := makePKI(t)
	d, err := startDaemon(true, "tok-tls", []string{"--tls-cert", p.srvPEM, "--tls-key", p.srvKey},
		checkpointd.WithTLS(&tls.Config{RootCAs: p.roots, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	// Plain TCP to a TLS daemon; a CA that did not sign the daemon's certificate.
	dialFails(t, d.address, []string{"CHECKPOINTD_TLS_CA"}, checkpointd.WithToken("tok-tls"))
	other := makePKI(t)
	dialFails(t, d.address, []string{"x509: certificate signed by unknown authority", "CHECKPOINTD_TLS_CA"},
		checkpointd.WithToken("tok-tls"), checkpointd.WithTLSFiles(other.caPEM, "", ""))

	// The right CA from the environment, as the CLI reads it.
	t.Setenv(checkpointd.EnvTLSCA, p.caPEM)
	t.Setenv(checkpointd.EnvToken, "tok-tls")
	client := d.dial(t)
	if info, err := client.GetServerInfo(ctx(t), &pb.GetServerInfoRequest{}); err != nil || !info.GetCapabilities().GetTls() {
		t.Fatalf("over TLS from CHECKPOINTD_TLS_CA: %v %v", info, err)
	}
}

func TestDialWaitsForADaemonOnlyWhenAsked(t *testing.T) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	address := fmt.Sprintf("127.0.0.1:%d", port)
	go func() {
		time.Sleep(700 * time.Millisecond)
		l, err := net.Listen("tcp", address)
		if err != nil {
			return
		}
		// A proxy to the TCP daemon, from 0.7 s on.
		defer l.Close()
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", strings.TrimPrefix(tcpDaemon.address, "tcp://"))
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(up, down) }()
			go func() { _, _ = io.Copy(down, up) }()
		}
	}()
	started := time.Now()
	client, err := checkpointd.Dial(ctx(t), address, checkpointd.WithToken(tcpToken),
		checkpointd.WithWaitForDaemon(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if took := time.Since(started); took < 700*time.Millisecond || took > 5*time.Second {
		t.Fatalf("connected after %s", took)
	}
}

func TestDialReadsTheEnvironmentAsTheCLIDoes(t *testing.T) {
	t.Setenv(checkpointd.EnvAddress, tcpDaemon.address)
	t.Setenv(checkpointd.EnvToken, tcpToken)
	client, err := checkpointd.Dial(ctx(t), "")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if client.Address() != tcpDaemon.address {
		t.Fatalf("address %s", client.Address())
	}
	// An explicit option wins over the environment.
	if _, err := checkpointd.Dial(ctx(t), "", checkpointd.WithToken("")); !checkpointd.IsUnauthenticated(err) {
		t.Fatalf("WithToken(\"\") over CHECKPOINTD_TOKEN: %v", err)
	}

	// No address: the socket in CHECKPOINTD_DATA_DIR, else the default data dir's.
	t.Setenv(checkpointd.EnvAddress, "")
	t.Setenv(checkpointd.EnvDataDir, unixDaemon.dataDir)
	viaDataDir, err := checkpointd.Dial(ctx(t), "")
	if err != nil {
		t.Fatal(err)
	}
	defer viaDataDir.Close()
	if viaDataDir.Address() != "unix://"+filepath.Join(unixDaemon.dataDir, "checkpointd.sock") {
		t.Fatalf("address %s", viaDataDir.Address())
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv(checkpointd.EnvDataDir, "")
	dialFails(t, "unix://"+filepath.Join(home, ".local/state/checkpointd/checkpointd.sock"), nil)
	_, err = checkpointd.Dial(ctx(t), "")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(home, ".local/state/checkpointd/checkpointd.sock")) {
		t.Fatalf("default data dir: %v", err)
	}

	// Unreadable TLS files are argument errors naming the variable.
	t.Setenv(checkpointd.EnvAddress, tcpDaemon.address)
	t.Setenv(checkpointd.EnvTLSCA, filepath.Join(home, "missing-ca.pem"))
	_, err = checkpointd.Dial(ctx(t), "")
	if !errors.As(err, &checkpointd.InvalidArgumentError{}) || status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), checkpointd.EnvTLSCA) {
		t.Fatalf("missing CA: %v", err)
	}
}

// sniProxy terminates TLS with the test PKI's server certificate, records the
// server name each client sent, and forwards the bytes to target.
type sniProxy struct {
	mu    sync.Mutex
	names []string
}

func (s *sniProxy) start(t *testing.T, p *pki, target string) string {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.srvPEM, p.srvKey)
	if err != nil {
		t.Fatal(err)
	}
	config := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			s.mu.Lock()
			s.names = append(s.names, hello.ServerName)
			s.mu.Unlock()
			return nil, nil
		}}
	l, err := tls.Listen("tcp", "127.0.0.1:0", config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				down.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, down) }()
			go func() { _, _ = io.Copy(down, up) }()
		}
	}()
	return l.Addr().(*net.TCPAddr).String()
}

func TestTLSNeverSendsAnIPAddressAsServerName(t *testing.T) {
	p := makePKI(t)
	proxy := &sniProxy{}
	address := proxy.start(t, p, strings.TrimPrefix(tcpDaemon.address, "tcp://"))
	port := address[strings.LastIndex(address, ":")+1:]
	for _, host := range []string{"127.0.0.1", "localhost"} {
		client, err := checkpointd.Dial(ctx(t), "tcp://"+host+":"+port, checkpointd.WithToken(tcpToken),
			checkpointd.WithTLSFiles(p.caPEM, "", ""))
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		client.Close()
	}
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	// The IP address was verified against the certificate's IP SAN, and sent as no name.
	if len(proxy.names) != 2 || proxy.names[0] != "" || proxy.names[1] != "localhost" {
		t.Fatalf("server names sent: %q", proxy.names)
	}
}

func TestEachCallKindGetsItsDefaultDeadline(t *testing.T) {
	seen := map[string]time.Duration{}
	var mu sync.Mutex
	observe := func(ctx context.Context, method string) {
		mu.Lock()
		defer mu.Unlock()
		if deadline, ok := ctx.Deadline(); ok {
			seen[method[strings.LastIndex(method, "/")+1:]] = time.Until(deadline)
		}
	}
	client := unixDaemon.dial(t, checkpointd.WithDialOptions(
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			observe(ctx, method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
			method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			observe(ctx, method)
			return streamer(ctx, desc, cc, method, opts...)
		})))
	writeTree(t, filepath.Join(unixDaemon.workspace, "deadlines"), map[string]string{"a.txt": "a"})
	background := context.Background()
	saved, err := checkpointd.CaptureSandboxCheckpoint(background, client,
		checkpointd.CaptureOptions{ThreadID: "t-deadlines", WorkspaceSubdir: "deadlines"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpointd.GetCheckpoint(background, client, saved.Id, false); err != nil {
		t.Fatal(err)
	}
	entries, err := client.ListEntries(background, &pb.ListEntriesRequest{CheckpointId: saved.Id})
	if err != nil {
		t.Fatal(err)
	}
	for _, err := entries.Recv(); err == nil; _, err = entries.Recv() {
	}
	mu.Lock()
	defer mu.Unlock()
	for method, want := range map[string]time.Duration{"Capture": time.Hour, "GetCheckpoint": 30 * time.Second,
		"ListEntries": 10 * time.Minute} {
		if got := seen[method]; got > want || got < want-5*time.Second {
			t.Errorf("%s: deadline in %s, want %s", method, got, want)
		}
	}
}

func TestDeadlinesAndCancelsAreTheContextErrors(t *testing.T) {
	writeTree(t, filepath.Join(unixDaemon.workspace, "late"), map[string]string{"a.txt": "a"})
	opts := checkpointd.CaptureOptions{ThreadID: "t-late", WorkspaceSubdir: "late"}
	hasty := unixDaemon.dial(t, checkpointd.WithDeadlines(checkpointd.Deadlines{Work: time.Millisecond}))
	_, err := checkpointd.CaptureSandboxCheckpoint(context.Background(), hasty, opts)
	var e checkpointd.Error
	if !errors.Is(err, context.DeadlineExceeded) || !checkpointd.IsDeadlineExceeded(err) ||
		!errors.As(err, &e) || e.Code != checkpointd.CodeDeadlineExceeded {
		t.Fatalf("past the Work deadline: %v", err)
	}
	// A context's own deadline wins over the default.
	if _, err := checkpointd.CaptureSandboxCheckpoint(ctx(t), hasty, opts); err != nil {
		t.Fatalf("with the context's deadline: %v", err)
	}

	// Cancelled at its first event: the scan of 300 files has not started.
	files := map[string]string{}
	for i := range 300 {
		files[fmt.Sprintf("f%03d.txt", i)] = fmt.Sprint(i)
	}
	writeTree(t, filepath.Join(unixDaemon.workspace, "late"), files)
	client := unixDaemon.dial(t)
	cancelled, cancel := context.WithCancel(context.Background())
	opts.OnEvent = func(*pb.CaptureEvent) { cancel() }
	started := time.Now()
	_, err = checkpointd.CaptureSandboxCheckpoint(cancelled, client, opts)
	if !errors.Is(err, context.Canceled) || !checkpointd.IsCancelled(err) || !errors.As(err, &e) ||
		e.Code != checkpointd.CodeCancelled || e.GRPCCode != codes.Canceled || time.Since(started) > 5*time.Second {
		t.Fatalf("cancelled: %v", err)
	}
	// Cancelled before it started.
	_, err = checkpointd.RestoreSandboxCheckpoint(cancelled, client, checkpointd.RestoreOptions{ThreadID: "t-late"})
	if !errors.Is(err, context.Canceled) || !errors.As(err, &e) || e.Code != checkpointd.CodeCancelled {
		t.Fatalf("cancelled before: %v", err)
	}
}
