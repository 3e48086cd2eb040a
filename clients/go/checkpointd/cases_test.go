package checkpointd_test

// clients/shared/cases.json run against a real daemon: the same inputs give the
// same results and error codes in every SDK.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"checkpointd.dev/clients/go/checkpointd"
	pb "checkpointd.dev/clients/go/checkpointdv1"
)

type caseStep struct {
	Write  map[string]string `json:"write"`
	Remove []string          `json:"remove"`
	Files  map[string]string `json:"files"`
	Call   string            `json:"call"`
	Args   map[string]any    `json:"args"`
	Expect *struct {
		Result any `json:"result"`
		Error  *struct {
			Code     string `json:"code"`
			GRPCCode int    `json:"grpcCode"`
		} `json:"error"`
	} `json:"expect"`
	Save string `json:"save"`
}

type sharedCase struct {
	ID          string     `json:"id"`
	Description string     `json:"description"`
	Steps       []caseStep `json:"steps"`
}

// plain is a message as the cases' results are: camelCase keys, numbers as
// JSON numbers, unset fields absent.
func plain(m proto.Message) map[string]any {
	out := map[string]any{}
	if m == nil || !m.ProtoReflect().IsValid() {
		return out
	}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		out[fd.JSONName()] = plainValue(fd, v)
		return true
	})
	return out
}

func plainValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch {
	case fd.IsList():
		list := []any{}
		for i := 0; i < v.List().Len(); i++ {
			list = append(list, plainScalar(fd, v.List().Get(i)))
		}
		return list
	case fd.IsMap():
		return nil // no result the cases compare holds a map
	}
	return plainScalar(fd, v)
}

func plainScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		return plain(v.Message().Interface())
	case protoreflect.Int64Kind, protoreflect.Int32Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return float64(v.Int())
	case protoreflect.Uint64Kind, protoreflect.Uint32Kind, protoreflect.Fixed64Kind:
		return float64(v.Uint())
	case protoreflect.EnumKind:
		return string(fd.Enum().Values().ByNumber(v.Enum()).Name())
	}
	return v.Interface()
}

func orEmpty(paths []string) []any {
	out := []any{}
	for _, p := range paths {
		out = append(out, p)
	}
	return out
}

type caseRun struct {
	t        *testing.T
	client   *checkpointd.Client
	id, dir  string
	suffix   string
	saved    map[string]map[string]any
	workRoot string
}

var placeholder = regexp.MustCompile(`\$([A-Za-z_]+)(?:\.([A-Za-z_]+))?`)

func (r *caseRun) thread(name string) string {
	if name == "" {
		return "case-" + r.id + "-" + r.suffix
	}
	return "case-" + r.id + "." + name + "-" + r.suffix
}

func (r *caseRun) replace(s string) string {
	return placeholder.ReplaceAllStringFunc(s, func(m string) string {
		parts := placeholder.FindStringSubmatch(m)
		switch name, field := parts[1], parts[2]; {
		case name == "thread":
			return r.thread(field)
		case name == "dir" && field == "":
			return r.dir
		case name == "root" && field == "":
			return r.workRoot
		case r.saved[name] != nil && field != "":
			if v, ok := r.saved[name][field].(string); ok {
				return v
			}
			r.t.Fatalf("$%s.%s: no such string field in %v", name, field, r.saved[name])
		}
		r.t.Fatalf("unknown placeholder %s", m)
		return ""
	})
}

func (r *caseRun) resolve(v any) any {
	switch x := v.(type) {
	case string:
		return r.replace(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = r.resolve(e)
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = r.resolve(e)
		}
		return out
	}
	return v
}

// match: an object matches on its keys (an expected null also matches a missing
// field), an array element by element, a scalar by equality.
func match(want, got any, where string) error {
	switch w := want.(type) {
	case nil:
		if got != nil {
			return fmt.Errorf("%s: want null, got %v", where, got)
		}
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %v", where, got)
		}
		for k, wv := range w {
			if err := match(wv, g[k], where+"."+k); err != nil {
				return err
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: want %v, got %v", where, w, got)
		}
		for i := range w {
			if err := match(w[i], g[i], fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
	default:
		if want != got {
			return fmt.Errorf("%s: want %#v, got %#v", where, want, got)
		}
	}
	return nil
}

func (r *caseRun) assertFiles(want map[string]string) {
	root := filepath.Join(r.workRoot, r.dir)
	got := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", rel)
		}
		b, err := os.ReadFile(path)
		got[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		r.t.Fatalf("files: got %v, want %v", got, want)
	}
}

func TestSharedCases(t *testing.T) {
	var table struct {
		Schema int          `json:"schema"`
		Cases  []sharedCase `json:"cases"`
	}
	sharedFile(t, "cases.json", &table)
	if table.Schema != 1 || len(table.Cases) == 0 {
		t.Fatalf("schema %d, %d cases", table.Schema, len(table.Cases))
	}
	client := unixDaemon.dial(t, checkpointd.WithWorkspace(unixDaemon.workspace))
	suffix := fmt.Sprintf("go%d", time.Now().UnixNano())
	for _, c := range table.Cases {
		t.Run(c.ID, func(t *testing.T) {
			r := &caseRun{t: t, client: client, id: c.ID, suffix: suffix, dir: "cases/" + c.ID,
				saved: map[string]map[string]any{}, workRoot: unixDaemon.workspace}
			if err := os.MkdirAll(filepath.Join(r.workRoot, r.dir), 0o755); err != nil {
				t.Fatal(err)
			}
			for i, step := range c.Steps {
				r.step(i, step)
			}
		})
	}
}

func (r *caseRun) step(i int, step caseStep) {
	r.t.Helper()
	root := filepath.Join(r.workRoot, r.dir)
	switch {
	case step.Write != nil:
		writeTree(r.t, root, step.Write)
	case step.Remove != nil:
		for _, rel := range step.Remove {
			if err := os.Remove(filepath.Join(root, rel)); err != nil {
				r.t.Fatal(err)
			}
		}
	case step.Files != nil:
		r.assertFiles(step.Files)
	case step.Call != "":
		args, _ := r.resolve(step.Args).(map[string]any)
		result, err := callSDK(r, step.Call, args)
		where := fmt.Sprintf("step %d (%s %v)", i, step.Call, args)
		r.check(where, step, result, err)
	default:
		r.t.Fatalf("step %d: unknown step %+v", i, step)
	}
}

func (r *caseRun) check(where string, step caseStep, result any, err error) {
	r.t.Helper()
	switch {
	case step.Expect != nil && step.Expect.Error != nil:
		var e checkpointd.Error
		if !errors.As(err, &e) {
			r.t.Fatalf("%s: want %s, got %v (result %v)", where, step.Expect.Error.Code, err, result)
		}
		if e.Code != step.Expect.Error.Code || int(e.GRPCCode) != step.Expect.Error.GRPCCode {
			r.t.Fatalf("%s: want %s (%d), got %s (%d): %s", where, step.Expect.Error.Code,
				step.Expect.Error.GRPCCode, e.Code, e.GRPCCode, e.Message)
		}
		return
	case err != nil:
		r.t.Fatalf("%s: %v", where, err)
	case step.Expect != nil:
		if mismatch := match(r.resolve(step.Expect.Result), result, "result"); mismatch != nil {
			r.t.Fatalf("%s: %v\nresult: %v", where, mismatch, result)
		}
	}
	if step.Save != "" {
		saved, ok := result.(map[string]any)
		if !ok {
			r.t.Fatalf("%s: cannot save %v", where, result)
		}
		r.saved[step.Save] = saved
	}
}

// args reads the cases' camelCase arguments; a key no SDK call knows fails the case.
type args struct {
	r    *caseRun
	call string
	m    map[string]any
	used []string
}

func (a *args) str(key string) string {
	a.used = append(a.used, key)
	s, _ := a.m[key].(string)
	return s
}

func (a *args) flag(key string) bool {
	a.used = append(a.used, key)
	b, _ := a.m[key].(bool)
	return b
}

func (a *args) num(key string) int {
	a.used = append(a.used, key)
	n, _ := a.m[key].(float64)
	return int(n)
}

func (a *args) policy() *pb.Policy {
	a.used = append(a.used, "policy")
	if a.m["policy"] == nil {
		return nil
	}
	raw, _ := json.Marshal(a.m["policy"])
	p := &pb.Policy{}
	if err := protojson.Unmarshal(raw, p); err != nil {
		a.r.t.Fatalf("policy %s: %v", raw, err)
	}
	return p
}

// secrets: a list of values, or an object of named values.
func (a *args) secrets() (values [][]byte, names []string) {
	a.used = append(a.used, "secrets")
	switch s := a.m["secrets"].(type) {
	case []any:
		for _, v := range s {
			values = append(values, []byte(v.(string)))
		}
	case map[string]any:
		for name, v := range s {
			names = append(names, name)
			values = append(values, []byte(v.(string)))
		}
	}
	return values, names
}

func (a *args) conversation() []any {
	a.used = append(a.used, "conversation")
	c, _ := a.m["conversation"].([]any)
	return c
}

func (a *args) done() {
	for key := range a.m {
		if !slices.Contains(a.used, key) {
			a.r.t.Fatalf("%s: argument %q is not mapped to the Go SDK", a.call, key)
		}
	}
}

func restoredResult(r *checkpointd.Restored) any {
	if r == nil {
		return nil
	}
	out := plain(r.CheckpointSummary)
	out["unfilledSecretPaths"] = orEmpty(r.UnfilledSecretPaths)
	out["unfilledSecretCount"] = float64(r.UnfilledSecretCount)
	if r.Plan != nil {
		plan := plain(r.Plan.RestorePlan)
		for _, counter := range []string{"filesWritten", "pathsDeleted", "filesKept", "dirsCreated", "bytesToFetch", "blobsToFetch"} {
			if plan[counter] == nil {
				plan[counter] = float64(0)
			}
		}
		plan["written"], plan["deleted"] = orEmpty(r.Plan.Written), orEmpty(r.Plan.Deleted)
		out["plan"] = plan
	}
	return out
}

func checkpointResult(c *checkpointd.Checkpoint) any {
	if c == nil {
		return nil
	}
	out := plain(c.CheckpointSummary)
	artifacts, conversation := []any{}, []any{}
	for _, a := range c.Artifacts {
		artifacts = append(artifacts, plain(a))
	}
	for _, m := range c.Conversation {
		var v any
		if err := json.Unmarshal(m, &v); err != nil {
			return err
		}
		conversation = append(conversation, v)
	}
	out["artifacts"], out["conversation"] = artifacts, conversation
	return out
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// callSDK makes one call of the cases' vocabulary through the Go SDK and gives
// its result in the cases' plain JSON form.
func callSDK(r *caseRun, call string, m map[string]any) (any, error) {
	a := &args{r: r, call: call, m: m}
	defer a.done()
	ctx := ctx(r.t)
	switch call {
	case "capture":
		o := checkpointd.CaptureOptions{ThreadID: a.str("threadId"), WorkspaceSubdir: a.str("workspaceSubdir"),
			WorkspaceRoot: a.str("workspaceRoot"), Label: a.str("label"), Conversation: a.conversation(),
			Policy: a.policy(), SkipIfUnchanged: a.flag("skipIfUnchanged")}
		o.Secrets, o.SecretNames = a.secrets()
		saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, r.client, o)
		if err != nil {
			return nil, err
		}
		return plain(saved.CheckpointSummary), nil
	case "restore":
		o := checkpointd.RestoreOptions{ThreadID: a.str("threadId"), WorkspaceSubdir: a.str("workspaceSubdir"),
			WorkspaceRoot: a.str("workspaceRoot"), CheckpointID: a.str("checkpointId"), DryRun: a.flag("dryRun"),
			RequireSecrets: a.flag("requireSecrets"), Policy: a.policy()}
		o.Secrets, o.SecretNames = a.secrets()
		restored, err := checkpointd.RestoreSandboxCheckpoint(ctx, r.client, o)
		return restoredResult(restored), err
	case "get":
		got, err := checkpointd.GetCheckpoint(ctx, r.client, a.str("checkpointId"), a.flag("includeConversation"))
		return checkpointResult(got), err
	case "list":
		out := []any{}
		for checkpoint, err := range checkpointd.ListCheckpoints(ctx, r.client, checkpointd.ListOptions{ThreadID: a.str("threadId")}) {
			if err != nil {
				return nil, err
			}
			out = append(out, plain(checkpoint))
		}
		return out, nil
	case "head":
		head, err := checkpointd.GetHead(ctx, r.client, a.str("threadId"))
		return nullable(head), err
	case "fork":
		forked, err := checkpointd.ForkCheckpoint(ctx, r.client, checkpointd.ForkOptions{SourceThreadID: a.str("sourceThreadId"),
			SourceCheckpointID: a.str("sourceCheckpointId"), DestinationThreadID: a.str("destinationThreadId")})
		return plain(forked), err
	case "deleteHead":
		head, err := checkpointd.DeleteHead(ctx, r.client, a.str("threadId"), a.str("checkpointId"))
		return nullable(head), err
	case "deleteCheckpoints":
		pruned, err := checkpointd.DeleteCheckpoints(ctx, r.client, a.str("threadId"), a.num("keep"), a.flag("dryRun"))
		if err != nil {
			return nil, err
		}
		return map[string]any{"deleted": orEmpty(pruned.GetDeletedCheckpointIds()),
			"deletedCount": float64(pruned.GetDeletedCount()), "idsTruncated": pruned.GetIdsTruncated(),
			"dryRun": pruned.GetDryRun()}, nil
	}
	r.t.Fatalf("unknown call %q", call)
	return nil, nil
}
