package checkpointd_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func goTool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("go is needed: ", err)
	}
	return path
}

// offline: module lookups from the local module cache only (.ci/run fills it).
func offline() []string {
	return append(cleanEnv(), "GOPROXY=off", "GOSUMDB=off", "GOFLAGS=-mod=mod", "GOWORK=off")
}

// The README's lines for another module, run as written (with this checkout's
// path), then the README's example built in that module and run against a daemon.
func TestAnotherModuleDependsOnThisOne(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```sh\n(go mod edit .*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("the README has no go mod edit block")
	}
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(string(block[1]), "/path/to/checkpointd/clients/go", checkout)
	module := t.TempDir()
	example, err := os.ReadFile(filepath.Join("..", "examples", "crash-and-restore", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(module, "main.go"), example, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = module, offline()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	run(goTool(t), "mod", "init", "example.com/orchestrator")
	run("sh", "-ec", script)
	goMod, _ := os.ReadFile(filepath.Join(module, "go.mod"))
	if !strings.Contains(string(goMod), "replace checkpointd.dev/clients/go => "+checkout) ||
		!strings.Contains(string(goMod), "google.golang.org/grpc") {
		t.Fatalf("go.mod:\n%s", goMod)
	}
	run(goTool(t), "build", "-o", "orchestrator", ".")
	writeTree(t, filepath.Join(unixDaemon.workspace, "consumer"), map[string]string{"a.txt": "a"})
	if out := run(filepath.Join(module, "orchestrator"), unixDaemon.address, "t-consumer"); !strings.HasPrefix(out, "New thread\nSaved ") {
		t.Fatalf("the example in another module: %s", out)
	}
}

// reference/checkpointd.txt, which the README links, is `go doc -all` of this
// package as it is. A first output that differs is logged with its first
// differing line and go doc is asked once more (a reference that is really
// stale differs both times; a passing go doc's output has been seen to differ).
func TestCommittedReferenceIsGoDocOutput(t *testing.T) {
	got, err := os.ReadFile(filepath.Join("..", "reference", "checkpointd.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		want := goDoc(t)
		if string(got) == want {
			return
		}
		line := firstDifference(string(got), want)
		if attempt == 2 {
			t.Fatalf("reference/checkpointd.txt is not go doc's output (%s); in clients/go run:\n"+
				"go doc -all ./checkpointd > reference/checkpointd.txt", line)
		}
		t.Logf("go doc's first output differs from the reference (%s); asking again", line)
	}
}

func goDoc(t *testing.T) string {
	cmd := exec.Command(goTool(t), "doc", "-all", ".")
	cmd.Env = offline()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go doc: %v: %s", err, stderr.String())
	}
	// When go doc cannot have `go list` name the directory's import path, its
	// first line says `import "."` and every other line is as usual: the path
	// is then this module's (go.mod) plus the package's directory.
	const unnamed = "package checkpointd // import \".\"\n"
	if rest, found := strings.CutPrefix(string(out), unnamed); found {
		goMod, err := os.ReadFile(filepath.Join("..", "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		module := modulePath(goMod)
		t.Logf("go doc did not name the import path (%s); it is %s/checkpointd by go.mod",
			strings.TrimSpace(stderr.String()), module)
		return fmt.Sprintf("package checkpointd // import %q\n", module+"/checkpointd") + rest
	}
	return string(out)
}

// modulePath is the path on go.mod's module line.
func modulePath(goMod []byte) string {
	for _, line := range strings.Split(string(goMod), "\n") {
		if rest, found := strings.CutPrefix(strings.TrimSpace(line), "module "); found {
			return strings.Trim(strings.TrimSpace(rest), "\"")
		}
	}
	return ""
}

// firstDifference names the first line where a and b differ, with both texts.
func firstDifference(a, b string) string {
	left, right := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(left) || i < len(right); i++ {
		var l, r string
		if i < len(left) {
			l = left[i]
		}
		if i < len(right) {
			r = right[i]
		}
		if l != r {
			return fmt.Sprintf("line %d: reference %q, go doc %q", i+1, l, r)
		}
	}
	return "equal lines"
}
