package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/telemetry"
)

// joinResult is how a `join` run in the background ended.
type joinResult struct {
	code           int
	stdout, stderr *lockedBuffer
}

// startJoin runs `p2ptrain join args` in the background; the channel gets
// its result when it returns.
func startJoin(ctx context.Context, args ...string) (stdout *lockedBuffer, done <-chan joinResult) {
	res := joinResult{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}}
	ch := make(chan joinResult, 1)
	go func() {
		res.code = run(ctx, append([]string{"join"}, args...), res.stdout, res.stderr)
		ch <- res
	}()
	return res.stdout, ch
}

// dialAddr waits for the loopback address a join prints under "dial this peer at:".
func dialAddr(t *testing.T, stdout *lockedBuffer, done <-chan joinResult) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := loopbackAddr.FindStringSubmatch(stdout.String()); m != nil {
			return m[1]
		}
		select {
		case r := <-done:
			t.Fatalf("join exited %d before printing its address:\n%s\n%s", r.code, r.stdout, r.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no address printed within 30s:\n%s", stdout)
	return ""
}

// TestJoinWritesMetricsFile: two peers train a tiny gpt for a few steps,
// each with --metrics-file. Each file holds the step records 1..N with
// their compute and all-reduce times, the evaluations, and a done event,
// every record named after the peer's node.name or, without one, its peer
// ID.
func TestJoinWritesMetricsFile(t *testing.T) {
	const steps = 4
	dir := t.TempDir()
	conf := writeFile(t, "c.toml", fmt.Sprintf(`
[node]
cluster = "metrics-file-test"
listen = ["/ip4/127.0.0.1/tcp/0"]
mdns = false
api = ""
[gossip]
heartbeat = "250ms"
failure_timeout = "1500ms"
[train]
model = "gpt"
data = %q
steps = %d
min_peers = 2
batch_size = 2
eval_every = 2
eval_samples = 4
optimizer = "adamw"
lr = 0.003
warmup_steps = 0
[train.gpt]
layers = 1
d_model = 16
heads = 2
context = 16
`, filepath.Join(runtime.GOROOT(), "src", "strings"), steps))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fileA, fileB := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	outA, doneA := startJoin(ctx, "--config", conf, "--name", "peer-a", "--metrics-file", fileA)
	addr := dialAddr(t, outA, doneA)
	outB, doneB := startJoin(ctx, "--config", conf, "--bootstrap", addr, "--metrics-file", fileB)
	peerB := dialAddr(t, outB, doneB)
	peerB = peerB[strings.LastIndex(peerB, "/p2p/")+len("/p2p/"):]
	for _, done := range []<-chan joinResult{doneA, doneB} {
		if r := <-done; r.code != 0 {
			t.Fatalf("join exited %d:\n%s\n%s", r.code, r.stdout, r.stderr)
		}
	}
	for _, f := range []struct{ path, run string }{{fileA, "peer-a"}, {fileB, peerB}} {
		recs, err := telemetry.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		checkRunRecords(t, f.path, f.run, steps, recs)
	}
}

// checkRunRecords checks the records of one peer's metrics file.
func checkRunRecords(t *testing.T, path, run string, steps int, recs []telemetry.Record) {
	t.Helper()
	var stepNums []uint64
	evals, done := 0, 0
	for _, r := range recs {
		if r.Run != run || r.Seq != 0 || r.Time.IsZero() {
			t.Errorf("%s: record %+v: want run %q, no seq, a time", path, r, run)
		}
		switch r.Kind {
		case telemetry.KindStep:
			stepNums = append(stepNums, r.Step)
			if !(r.ComputeS > 0) || !(r.AllreduceS > 0) || math.Abs(r.StepS-r.ComputeS-r.AllreduceS) > 1e-9 ||
				r.BytesSent <= 0 || r.Codec == "" || r.Peers != 2 || r.Loss <= 0 {
				t.Errorf("%s: step record %+v: want compute and all-reduce times summing to the step's, bytes sent, the codec, 2 peers, a loss", path, r)
			}
		case telemetry.KindEval:
			evals++
			if r.TestLoss == nil || r.BitsPerByte == nil || r.Accuracy != nil {
				t.Errorf("%s: evaluation %+v: want the gpt's test loss and bits per byte", path, r)
			}
		case telemetry.KindEvent:
			if r.Event == telemetry.EventDone {
				done++
				if r.Step != uint64(steps) {
					t.Errorf("%s: done event at step %d, want %d", path, r.Step, steps)
				}
			}
		}
	}
	for i, s := range stepNums {
		if s != uint64(i+1) {
			t.Fatalf("%s: step records numbered %v, want 1..%d", path, stepNums, steps)
		}
	}
	if len(stepNums) != steps || evals < steps/2 || done != 1 || recs[len(recs)-1].Event != telemetry.EventDone {
		t.Errorf("%s: %d step records, %d evaluations, %d done events (last record %+v); want %d, at least %d, 1 and last",
			path, len(stepNums), evals, done, recs[len(recs)-1], steps, steps/2)
	}
}

// TestMetricsFileChecked: a metrics file in a directory that does not
// exist, or one that is a directory, is refused at start by its key.
func TestMetricsFileChecked(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing directory", filepath.Join(dir, "nope", "m.jsonl"), "no such file or directory"},
		{"a directory", dir, "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, "join", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "", "--mdns=false", "--metrics-file", tc.path)
			if code != 2 || !strings.Contains(stderr, "log.metrics_file") || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 2 naming log.metrics_file and %q", code, stderr, tc.want)
			}
		})
	}
}
