package checkpointd_test

// Test helpers: a real daemon (`python -m checkpointd serve`) in a fresh /tmp
// directory, a writer-lease holder, and a TCP proxy that can lose a reply. The
// Python is $CHECKPOINTD_PYTHON, else the repository's .venv (make build).

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"checkpointd.dev/clients/go/checkpointd"
)

func python() string {
	if p := os.Getenv("CHECKPOINTD_PYTHON"); p != "" {
		return p
	}
	p, _ := filepath.Abs(filepath.Join("..", "..", "..", ".venv", "bin", "python"))
	return p
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CHECKPOINTD_") {
			env = append(env, kv)
		}
	}
	return env
}

type daemon struct {
	address, token, workspace, blobsDir, store, base string
	dataDir                                          string
	cmd                                              *exec.Cmd
	log                                              *syncBuffer
	dialOptions                                      []checkpointd.Option
}

// syncBuffer is the daemon's output, written by its process while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startDaemon(tcp bool, token string, extra []string, dial ...checkpointd.Option) (*daemon, error) {
	base, err := os.MkdirTemp("/tmp", "cpd-go-")
	if err != nil {
		return nil, err
	}
	d := &daemon{token: token, base: base, log: &syncBuffer{},
		workspace: filepath.Join(base, "ws"), blobsDir: filepath.Join(base, "blobs"),
		store: "sqlite://" + filepath.Join(base, "checkpoints.db")}
	dataDir := filepath.Join(base, "data")
	d.dataDir = dataDir
	for _, dir := range []string{d.workspace, d.blobsDir, dataDir} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
	}
	d.address = "unix://" + filepath.Join(dataDir, "checkpointd.sock")
	if tcp {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		d.address = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	}
	d.cmd = exec.Command(python(), "-m", "checkpointd", "serve", "--workspace", d.workspace,
		"--data-dir", dataDir, "--store", d.store, "--blobs", "file://"+d.blobsDir,
		"--listen", d.address, "--grace-period", "5s")
	d.cmd.Args = append(d.cmd.Args, extra...)
	d.dialOptions = dial
	d.cmd.Env = cleanEnv()
	if token != "" {
		d.cmd.Env = append(d.cmd.Env, "CHECKPOINTD_TOKEN="+token)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	client, err := checkpointd.Dial(ctx, d.address, append([]checkpointd.Option{checkpointd.WithToken(token),
		checkpointd.WithConnectTimeout(30 * time.Second), checkpointd.WithWaitForDaemon(30 * time.Second)}, dial...)...)
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("daemon did not start: %w\n%s", err, d.log.String())
	}
	client.Close()
	return d, nil
}

func (d *daemon) stop() {
	if d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = d.cmd.Process.Kill()
			<-done
		}
	}
	_ = os.RemoveAll(d.base)
}

func (d *daemon) dial(t *testing.T, opts ...checkpointd.Option) *checkpointd.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts = append(append([]checkpointd.Option{}, d.dialOptions...), opts...)
	if d.token != "" {
		opts = append([]checkpointd.Option{checkpointd.WithToken(d.token)}, opts...)
	}
	client, err := checkpointd.Dial(ctx, d.address, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", d.address, err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// holdLease holds the writer lease of thread in the daemon's store until release().
func holdLease(t *testing.T, d *daemon, thread string) (release func()) {
	t.Helper()
	script := strings.Join([]string{
		"import asyncio, sys",
		"from checkpointd import open_store",
		"async def main():",
		"    store = await open_store(sys.argv[1])",
		"    lease = await store.acquire_writer(sys.argv[2])",
		"    print('held', flush=True)",
		"    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)",
		"    await lease.release()",
		"    await store.aclose()",
		"asyncio.run(main())",
	}, "\n")
	cmd := exec.Command(python(), "-c", script, d.store, thread)
	cmd.Env = cleanEnv()
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "held") {
		t.Fatalf("lease holder: %q %v", line, err)
	}
	return func() {
		stdin.Close()
		_ = cmd.Wait()
	}
}

// proxy forwards TCP to target; loseReplyContaining arms it to drop the first
// chunk from the daemon that holds those bytes and cut every connection.
type proxy struct {
	listener net.Listener
	mu       sync.Mutex
	armed    []byte
	cuts     int
	conns    []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{listener: l}
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
			p.mu.Lock()
			p.conns = append(p.conns, down, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, down) }()
			go p.pump(down, up)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) pump(down, up net.Conn) {
	buf := make([]byte, 64*1024)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.armed != nil && bytes.Contains(buf[:n], p.armed) {
				p.armed = nil
				p.cuts++
				for _, c := range p.conns {
					c.Close()
				}
				p.conns = nil
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			if _, werr := down.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			down.Close()
			return
		}
	}
}

func (p *proxy) address() string { return "tcp://" + p.listener.Addr().String() }

func (p *proxy) loseReplyContaining(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = []byte(s)
}

func (p *proxy) close() {
	p.listener.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
