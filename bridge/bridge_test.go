package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/train"
)

// proc is a fake training process speaking the protocol from the
// process's side.
type proc struct {
	t        *testing.T
	main, cb net.Conn
	reply    helloReply
	mem      []byte
	grads    []float32
	params   []float32
	n        int
}

// testLayout: three tensors in two buckets (bucket 0 holds tensor 2).
var testLayout = hello{Op: "hello", Version: Version, Role: "main", PID: 7,
	Params: []param{
		{Name: "w1", Shape: []int{2, 3}, DType: "float32"},
		{Name: "b1", Shape: []int{3}, DType: "float32"},
		{Name: "w2", Shape: []int{3, 2}, DType: "float32"},
	},
	Buckets:  [][]int{{2}, {0, 1}},
	Settings: map[string]string{"lr": "0.1"},
	Hash:     strings.Repeat("ab", 32),
}

func listen(t *testing.T, steps uint64) *Server {
	t.Helper()
	s, err := Listen(filepath.Join(t.TempDir(), "d.sock"), Options{Peer: "peer1", Steps: steps, CheckEvery: 2, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func dial(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// hello sends h on a new connection and returns the answer.
func hello1(t *testing.T, s *Server, h hello) (net.Conn, helloReply) {
	t.Helper()
	c := dial(t, s)
	if err := writeMsg(c, h); err != nil {
		t.Fatal(err)
	}
	var r helloReply
	recv(t, c, &r)
	return c, r
}

func recv(t *testing.T, c net.Conn, v any) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := readMsg(c)
	if err != nil {
		t.Fatalf("reading: %v", err)
	}
	if err := decode(body, v); err != nil {
		t.Fatal(err)
	}
}

// register connects a fake process with testLayout and returns it with the
// daemon's session.
func register(t *testing.T, s *Server) (*proc, *Learner) {
	t.Helper()
	main, r := hello1(t, s, testLayout)
	if !r.OK {
		t.Fatalf("hello refused: %+v", r)
	}
	p := &proc{t: t, main: main, reply: r, n: 15}
	f, err := os.OpenFile(r.SHM, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if p.mem, err = syscall.Mmap(int(f.Fd()), 0, int(r.SHMBytes), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(p.mem) })
	all := unsafe.Slice((*float32)(unsafe.Pointer(&p.mem[0])), 2*p.n)
	p.grads, p.params = all[:p.n], all[p.n:]
	var cr helloReply
	p.cb, cr = hello1(t, s, hello{Op: "hello", Version: Version, Role: "callback", Session: r.Session})
	if !cr.OK {
		t.Fatalf("callback refused: %+v", cr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := s.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return p, l
}

func (p *proc) send(v any) {
	p.t.Helper()
	if err := writeMsg(p.main, v); err != nil {
		p.t.Fatal(err)
	}
}

// sendStep writes gradient value base+i at flat index i and sends both
// buckets and the wait for step.
func (p *proc) sendStep(step uint64, base float32) {
	for i := range p.grads {
		p.grads[i] = base + float32(i)
	}
	loss := 0.5
	for _, b := range []int{0, 1} {
		p.send(stepMsg{Op: "grad", Step: step, Bucket: &b})
	}
	p.send(stepMsg{Op: "wait", Step: step, Loss: &loss})
}

func TestHelloRefusals(t *testing.T) {
	s := listen(t, 10)
	edit := func(f func(h *hello)) hello {
		h := testLayout
		h.Params = slices.Clone(testLayout.Params)
		h.Buckets = slices.Clone(testLayout.Buckets)
		f(&h)
		return h
	}
	for _, tc := range []struct {
		name, kind, want string
		h                hello
	}{
		{"version", "version", "protocol version 1", edit(func(h *hello) { h.Version = 1 })},
		{"float16", "layout", `parameter "b1" has dtype "float16"`, edit(func(h *hello) { h.Params[1].DType = "float16" })},
		{"duplicate name", "layout", `"w1" appears twice`, edit(func(h *hello) { h.Params[1].Name = "w1" })},
		{"unbucketed", "layout", `"b1" is in no bucket`, edit(func(h *hello) { h.Buckets = [][]int{{2}, {0}} })},
		{"twice bucketed", "layout", "in another bucket", edit(func(h *hello) { h.Buckets = [][]int{{2, 0}, {0, 1}} })},
		{"zero dimension", "layout", "shape [0 3]", edit(func(h *hello) { h.Params[0].Shape = []int{0, 3} })},
		{"bad hash", "layout", "not 64 lowercase hex", edit(func(h *hello) { h.Hash = "xyz" })},
		{"bad setting", "layout", `setting "l r"`, edit(func(h *hello) { h.Settings = map[string]string{"l r": "1"} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, r := hello1(t, s, tc.h)
			if r.OK || r.Kind != tc.kind || !strings.Contains(r.Error, tc.want) {
				t.Fatalf("reply %+v, want kind %q naming %q", r, tc.kind, tc.want)
			}
		})
	}
	register(t, s)
	if _, r := hello1(t, s, testLayout); r.OK || r.Kind != "busy" {
		t.Fatalf("a second process was not refused as busy: %+v", r)
	}
}

func TestSocketModes(t *testing.T) {
	s := listen(t, 10)
	st, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", st.Mode().Perm())
	}
	_, l := register(t, s)
	if st, err := os.Stat(l.mem.path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("shared memory: %v, mode %v", err, st.Mode().Perm())
	}
	if _, err := Listen(s.Path(), Options{}); err == nil || !strings.Contains(err.Error(), "another daemon") {
		t.Fatalf("a second daemon on a live socket: %v", err)
	}
}

// TestStepRoundTrip: Compute hands over the process's buckets in order, a
// retry hands the same gradients again (though the trainer averaged them
// in place), the averages are in shared memory when Apply answers, Apply
// waits for no "applied" unless it asks for a hash (a callback request
// until the next step's messages tells the process to answer after its
// update), and the process's hash comes with the step a check needs.
func TestStepRoundTrip(t *testing.T) {
	s := listen(t, 10)
	p, l := register(t, s)
	ctx := context.Background()
	if l.NumParams() != 15 || len(l.Buckets()) != 2 || l.Settings()["external.lr"] != "0.1" {
		t.Fatalf("layout: %d params, %d buckets, settings %v", l.NumParams(), len(l.Buckets()), l.Settings())
	}
	p.sendStep(0, 1)
	var order []int
	var got [][]float32
	for range 2 { // the second Compute is a retry of the same step
		order, got = nil, nil
		loss, err := l.Compute(ctx, 0, train.Shard{}, func(b int, g []float32) {
			order = append(order, b)
			got = append(got, slices.Clone(g))
			for i := range g {
				g[i] *= 2 // the "average"
			}
		})
		if err != nil || loss != 0.5 {
			t.Fatalf("Compute: loss %v, %v", loss, err)
		}
	}
	// Bucket 0 is tensor w2 (flat 0..5), bucket 1 is w1 and b1 (flat 6..14).
	if !slices.Equal(order, []int{0, 1}) || got[0][0] != 1 || got[1][0] != 7 || len(got[1]) != 9 {
		t.Fatalf("buckets %v: %v", order, got)
	}
	done := make(chan error, 1)
	go func() { done <- l.Apply(ctx, 0) }()
	var w waitReply
	recv(t, p.main, &w)
	if w.Status != "averaged" || w.Step != 0 || w.WantHash {
		t.Fatalf("answer %+v", w)
	}
	if p.grads[0] != 2 || p.grads[14] != 30 {
		t.Fatalf("averages in shared memory: %v", p.grads)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Before the process's next message a hash request says it is to
	// answer after step 0's update (after 1 step); once one came, not.
	for i := range p.params {
		p.params[i] = float32(-i)
	}
	hashAnswer := func(after, step uint64) {
		go func() {
			var req callbackReq
			recv(t, p.cb, &req)
			if req.Op != "hash" || req.After != after {
				t.Errorf("request %+v, want a hash request with after %d", req, after)
			}
			writeMsg(p.cb, callbackReply{OK: true, Step: step, Hash: model.HashFloats(p.params)})
		}()
	}
	hashAnswer(1, 1)
	if params, err := l.Params(ctx); err != nil || params[5] != -5 {
		t.Fatalf("Params after step 0: %v, %v", params, err)
	}
	// Step 1 completes a check (check_every 2): the process sends its hash
	// and its parameters are in the parameter region.
	// Its gradient is the one the process wrote for step 1, not step 0's
	// backup, on the first attempt and on a retry alike.
	p.sendStep(1, 3)
	for attempt := range 2 {
		if _, err := l.Compute(ctx, 1, train.Shard{}, func(b int, g []float32) {
			if want := float32(3 + 6*b); g[0] != want {
				t.Errorf("step 1 attempt %d: bucket %d starts with %v, want %v", attempt, b, g[0], want)
			}
			clear(g)
		}); err != nil {
			t.Fatal(err)
		}
	}
	go func() { done <- l.Apply(ctx, 1) }()
	recv(t, p.main, &w)
	if !w.WantHash {
		t.Fatalf("step 1 answer %+v, want a hash request", w)
	}
	for i := range p.params {
		p.params[i] = float32(i)
	}
	p.send(stepMsg{Op: "applied", Step: 1, Hash: model.HashFloats(p.params)})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	params, err := l.Params(ctx)
	if err != nil || params[5] != 5 {
		t.Fatalf("Params: %v, %v", params, err)
	}
	// A process whose hash does not match its parameters is an error.
	p.params[5] = 99
	if _, err := l.Params(ctx); err == nil || !errors.Is(err, train.ErrLearner) {
		t.Fatalf("Params with a wrong hash: %v", err)
	}
	// Step 1's messages confirmed step 0's update and step 1's was
	// answered: a request now has the process wait for nothing.
	go func() {
		var req callbackReq
		recv(t, p.cb, &req)
		if req.Op != "state" || req.After != 0 {
			t.Errorf("request %+v, want a state request with after 0", req)
		}
		writeMsg(p.cb, callbackReply{OK: false, Step: 2, Error: "not now"})
	}()
	if _, err := l.State(2); !errors.Is(err, train.ErrStateUnavailable) {
		t.Fatalf("State: %v", err)
	}
}

// TestRestoreAndState: a state reaches the process at its next wait, and
// the process's state comes back through the callback connection.
func TestRestoreAndState(t *testing.T) {
	s := listen(t, 10)
	p, l := register(t, s)
	ctx := context.Background()
	ck := &model.Checkpoint{Step: 4, Params: make([]byte, 4*15), Optimizer: []byte("opt")}
	ck.Params[0] = 1
	done := make(chan error, 1)
	go func() { done <- l.Restore(ctx, ck) }()
	p.sendStep(0, 1) // its gradients of step 0 are dropped
	var w waitReply
	recv(t, p.main, &w)
	if w.Status != "restore" || w.Step != 4 || w.ParamsBytes != 60 || w.ExtraBytes != 3 {
		t.Fatalf("answer %+v", w)
	}
	b, err := os.ReadFile(w.Path)
	if err != nil || b[0] != 1 || string(b[60:]) != "opt" {
		t.Fatalf("state file: %v %v", b, err)
	}
	clear(p.params)
	p.params[0] = float32FromBits(1)
	p.send(stepMsg{Op: "restored", Step: 4, Hash: model.HashFloats(p.params)})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := l.Compute(ctx, 0, train.Shard{}, nil); err == nil {
		t.Fatal("Compute of step 0 after a restore to step 4 succeeded")
	}
	// The process serves its state on the callback connection.
	go func() {
		var req callbackReq
		recv(t, p.cb, &req)
		if req.Op != "state" || req.Step != 4 {
			t.Errorf("request %+v", req)
		}
		os.WriteFile(req.Path, append(make([]byte, 60), "xy"...), 0o600)
		writeMsg(p.cb, callbackReply{OK: true, Step: 4, ParamsBytes: 60, ExtraBytes: 2})
	}()
	st, err := l.State(4)
	if err != nil || len(st.Params) != 60 || string(st.Optimizer) != "xy" || st.Step != 4 {
		t.Fatalf("State: %+v, %v", st, err)
	}
	go func() {
		var req callbackReq
		recv(t, p.cb, &req)
		writeMsg(p.cb, callbackReply{OK: false, Step: 5, Error: "at step 5"})
	}()
	if _, err := l.State(4); !errors.Is(err, train.ErrStateUnavailable) {
		t.Fatalf("State of a process at another step: %v", err)
	}
}

// TestProcessExitFailsTheRun: a process that disconnects makes Compute fail
// with train.ErrLearner (the trainer stops rather than retrying forever).
func TestProcessExitFailsTheRun(t *testing.T) {
	s := listen(t, 10)
	p, l := register(t, s)
	b := 0
	p.send(stepMsg{Op: "grad", Step: 0, Bucket: &b})
	p.main.Close()
	_, err := l.Compute(context.Background(), 0, train.Shard{}, func(int, []float32) {})
	if !errors.Is(err, train.ErrLearner) || !errors.Is(err, errClosed) {
		t.Fatalf("Compute after the process left: %v", err)
	}
}

// TestFinishAnswersWaits: once the run is over every wait is answered,
// "stopped" with the kind of the failure.
func TestFinishAnswersWaits(t *testing.T) {
	s := listen(t, 10)
	p, l := register(t, s)
	p.sendStep(0, 1)
	l.Finish(train.ErrSettingsDiffer, 10*time.Second)
	var w waitReply
	recv(t, p.main, &w)
	if w.Status != "stopped" || w.Kind != "settings" {
		t.Fatalf("answer %+v", w)
	}
}

func float32FromBits(b uint32) float32 { return *(*float32)(unsafe.Pointer(&b)) }

// TestExplainLayout: the description of another process's layout names
// the parameters whose shapes differ, those only one side has, another
// order and other buckets; the same layout explains to nothing.
func TestExplainLayout(t *testing.T) {
	desc := func(t *testing.T, params []param, buckets [][]int) []byte {
		t.Helper()
		l, err := parseLayout(params, buckets)
		if err != nil {
			t.Fatal(err)
		}
		return l.desc
	}
	p := func(name string, shape ...int) param { return param{Name: name, Shape: shape, DType: "float32"} }
	mine := desc(t, []param{p("fc1.weight", 64, 784), p("fc1.bias", 64), p("fc2.weight", 10, 64)}, [][]int{{0, 1, 2}})
	for _, c := range []struct {
		name   string
		theirs []byte
		want   string
	}{
		{"the same", mine, ""},
		{"a shape", desc(t, []param{p("fc1.weight", 32, 784), p("fc1.bias", 64), p("fc2.weight", 10, 64)}, [][]int{{0, 1, 2}}),
			`"fc1.weight" has shape [64 784] here, [32 784] in the cluster's`},
		{"a parameter on each side", desc(t, []param{p("fc1.weight", 64, 784), p("fc1.bias", 64), p("head.weight", 10, 64)}, [][]int{{0, 1, 2}}),
			`"fc2.weight" [10 64] is only here; "head.weight" [10 64] is only in the cluster's`},
		{"the order", desc(t, []param{p("fc1.bias", 64), p("fc1.weight", 64, 784), p("fc2.weight", 10, 64)}, [][]int{{0, 1, 2}}),
			`the parameters are in another order: #0 is "fc1.weight" here, "fc1.bias" in the cluster's`},
		{"the buckets", desc(t, []param{p("fc1.weight", 64, 784), p("fc1.bias", 64), p("fc2.weight", 10, 64)}, [][]int{{0}, {1, 2}}),
			"grouped into other buckets (1 here, 2 in the cluster's"},
	} {
		got, err := explainLayout(mine, c.theirs)
		if err != nil || c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	var many []param
	for i := range 9 {
		many = append(many, p(fmt.Sprint("x", i), 1))
	}
	got, err := explainLayout(mine, desc(t, many, [][]int{{0, 1, 2, 3, 4, 5, 6, 7, 8}}))
	if err != nil || !strings.HasSuffix(got, "and 7 more differences") || strings.Count(got, ";") != maxDifferences {
		t.Errorf("twelve differences: %q, %v", got, err)
	}
	if _, err := explainLayout(mine, []byte("{")); err == nil {
		t.Error("a malformed description explained")
	}
	// Another peer's description is checked as a registration is, and
	// what it names is quoted and bounded.
	for _, bad := range []string{
		`{"params":[]}`,
		`{"params":[{"name":"","shape":[1],"dtype":"float32","bucket":0}]}`,
		`{"params":[{"name":"a","shape":[1],"dtype":"float32","bucket":0},{"name":"a","shape":[1],"dtype":"float32","bucket":0}]}`,
		`{"params":[{"name":"a","shape":[0],"dtype":"float32","bucket":0}]}`,
		`{"params":[{"name":"a","shape":[1],"dtype":"float32","bucket":1}]}`,
		`{"params":[{"name":"` + strings.Repeat("x", maxNameLen+1) + `","shape":[1],"dtype":"float32","bucket":0}]}`,
	} {
		if got, err := explainLayout(mine, []byte(bad)); err == nil {
			t.Errorf("description %.80s… explained as %q", bad, got)
		}
	}
	var long []param
	var all []int
	for i := range 40 {
		long, all = append(long, p(fmt.Sprintf("\x1b[31m%s%d", strings.Repeat("n", 400), i), 1)), append(all, i)
	}
	got, err = explainLayout(mine, desc(t, long, [][]int{all}))
	if err != nil || len(got) > maxExplanation+8 || strings.ContainsRune(got, 0x1b) {
		t.Errorf("long names with escapes: %d bytes, %v: %.200q", len(got), err, got)
	}
}
