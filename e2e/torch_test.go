package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// python is Debian's interpreter, the one that imports python3-torch (a
// python3 earlier on PATH may not see Debian's modules).
const python = "/usr/bin/python3"

// requireTorch fails the test when torch cannot be imported: the bridge's
// tests are part of the suite, and scripts/setup.sh installs it.
func requireTorch(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process suite: skipped with -short")
	}
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import torch (run scripts/setup.sh: it installs python3-torch): %v\n%s", python, err, out)
	}
}

// torchPeer is a daemon with --trainer external and the example training
// script (python/examples/fashion_mnist.py) beside it.
type torchPeer struct {
	d      *proc
	cmd    *exec.Cmd
	done   chan struct{}
	stderr strings.Builder

	mu    sync.Mutex
	steps int    // the last "step N" line the script printed
	final string // its "done ..." line
}

var stepLine = regexp.MustCompile(`^step (\d+) `)

// torchRun is what a torchPeer runs.
type torchRun struct {
	steps, minPeers int
	codec           string   // allreduce.codec ("": none)
	boot            string   // a peer to bootstrap through ("": none)
	script          []string // extra arguments of the script
}

// startTorchPeer starts a daemon with --trainer external and its script.
func startTorchPeer(t *testing.T, r torchRun) *torchPeer {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "d.sock")
	flags := []string{"--trainer", "external", "--socket", sock, "--steps", fmt.Sprint(r.steps), "--min-peers", fmt.Sprint(r.minPeers)}
	if r.boot != "" {
		flags = append(flags, "--bootstrap", r.boot)
	}
	if r.codec != "" {
		flags = append(flags, "--codec", r.codec)
	}
	d := startPeerConfig(t, "[train]\ncheck_every = 10\n[allreduce]\nframe_timeout = \"5s\"\n", flags...)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	script := []string{filepath.Join(root, "python/examples/fashion_mnist.py"), "--socket", sock,
		"--model", "mlp", "--hidden", "64", "--train-samples", "4096", "--eval-samples", "500"}
	cmd := exec.Command(python, append(script, r.script...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "python"))
	p := &torchPeer{d: d, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := sc.Text()
			p.mu.Lock()
			if m := stepLine.FindStringSubmatch(l); m != nil {
				fmt.Sscan(m[1], &p.steps)
			}
			if strings.HasPrefix(l, "done ") {
				p.final = l
			}
			p.mu.Unlock()
		}
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("training script beside %s:\n%s", d.addr, p.stderr.String())
		}
	})
	return p
}

// kill ends the daemon and its script with SIGKILL.
func (p *torchPeer) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.d.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	<-p.d.done
}

// step returns the last step the script reported.
func (p *torchPeer) step() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.steps
}

// torchWithin bounds one torch peer's run.
const torchWithin = 2 * time.Minute

var hashOf = regexp.MustCompile(`param_hash=([0-9a-f]{64})`)

// finish waits for the daemon and its script and returns the parameter
// hash both printed (they must agree).
func (p *torchPeer) finish(t *testing.T, steps int) string {
	t.Helper()
	for _, done := range []chan struct{}{p.d.done, p.done} {
		select {
		case <-done:
		case <-time.After(torchWithin):
			t.Fatalf("%s: no result within %s", p.d.addr, torchWithin)
		}
	}
	if p.d.err != nil || p.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("%s: daemon exit %v, script exit %d", p.d.addr, p.d.err, p.cmd.ProcessState.ExitCode())
	}
	p.d.mu.Lock()
	daemon := p.d.doneLine
	p.d.mu.Unlock()
	p.mu.Lock()
	script := p.final
	p.mu.Unlock()
	want := fmt.Sprintf("done step=%d ", steps)
	dh, sh := hashOf.FindStringSubmatch(daemon), hashOf.FindStringSubmatch(script)
	if !strings.HasPrefix(daemon, want) || !strings.HasPrefix(script, want) || dh == nil || sh == nil || dh[1] != sh[1] {
		t.Fatalf("%s: daemon %q, script %q: want step %d and one hash", p.d.addr, daemon, script, steps)
	}
	return dh[1]
}

func sameHashes(t *testing.T, peers []*torchPeer, steps int) {
	t.Helper()
	first := ""
	for _, p := range peers {
		h := p.finish(t, steps)
		if first == "" {
			first = h
		} else if h != first {
			t.Fatalf("replicas differ: %s vs %s", first, h)
		}
	}
	t.Logf("%d replicas at step %d, parameter hash %s", len(peers), steps, first[:16])
}

// TestTorchBridgeReplicasAgree: PyTorch processes behind 2 and 4 daemons
// end bit-identical, the script's hash equal to its daemon's, with the
// example's own residual CNN (convolutions, GroupNorm: no built-in model
// has them) and with the MLP.
func TestTorchBridgeReplicasAgree(t *testing.T) {
	requireTorch(t)
	for _, tc := range []struct {
		peers        int
		codec, model string
	}{{2, "none", "resnet"}, {4, "sint8", "mlp"}} {
		t.Run(fmt.Sprintf("%d peers %s %s", tc.peers, tc.codec, tc.model), func(t *testing.T) {
			const steps = 40
			peers := startTorchCluster(t, tc.peers, torchRun{steps: steps, minPeers: tc.peers, codec: tc.codec, script: []string{"--model", tc.model}})
			sameHashes(t, peers, steps)
		})
	}
}

// startTorchCluster starts n torch peers with r, all bootstrapping through
// the first.
func startTorchCluster(t *testing.T, n int, r torchRun) []*torchPeer {
	t.Helper()
	var peers []*torchPeer
	for i := range n {
		if i > 0 {
			r.boot = peers[0].d.addr
		}
		peers = append(peers, startTorchPeer(t, r))
	}
	return peers
}

// waitScriptStep waits until p's script reported step n.
func waitScriptStep(t *testing.T, p *torchPeer, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for p.step() < n {
		select {
		case <-p.done:
			t.Fatalf("the script exited at step %d before step %d:\n%s", p.step(), n, p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the script did not reach step %d within 2 minutes (at %d)", n, p.step())
		}
	}
}

// TestTorchBridgeStartsFromOneState: scripts whose models were
// initialised differently (another seed) still train one model: at step 0
// every peer takes the coordinator's parameters.
func TestTorchBridgeStartsFromOneState(t *testing.T) {
	requireTorch(t)
	const steps = 30
	a := startTorchPeer(t, torchRun{steps: steps, minPeers: 2})
	b := startTorchPeer(t, torchRun{steps: steps, minPeers: 2, boot: a.d.addr, script: []string{"--init-seed", "7"}})
	sameHashes(t, []*torchPeer{a, b}, steps)
}

// TestTorchBridgeKilledPeer: a peer (daemon and script) killed mid-run
// fails the step in flight on the others, who retry it without the dead
// peer and finish identical. The peer killed is one that joined the two
// others' ring (joinPaused) and trained 20 steps in it: killed in a ring
// of two (min_peers 2 lets two train before the third's script has
// registered), the survivor would lack a quorum of the last ring that
// trained and would rightly wait instead of retrying.
func TestTorchBridgeKilledPeer(t *testing.T) {
	requireTorch(t)
	const steps = 300
	// A scheduler and clipping: the retried step moves neither twice.
	r := torchRun{steps: steps, minPeers: 2, script: []string{"--schedule", "cosine", "--clip-norm", "1.0"}}
	peers := startTorchCluster(t, 2, r)
	peers = joinPaused(t, peers, r)
	joiner := peers[2]
	waitScriptStep(t, joiner, peers[0].step()+20)
	joiner.kill()
	sameHashes(t, peers[:2], steps)
	retried := false
	for _, p := range peers[:2] {
		retried = retried || strings.Contains(p.d.stder.String(), "retrying it")
	}
	if !retried {
		t.Fatal("no survivor logged a retried step")
	}
}

// joinPaused adds a peer with r to the running peers' ring: it stops
// their scripts (SIGSTOP) from step 50 until the joiner is in their ring,
// so they cannot finish first however fast a step is; their daemons keep
// serving gossip meanwhile, and the state the joiner asks for is answered
// once the scripts continue. It returns peers with the joiner last.
func joinPaused(t *testing.T, peers []*torchPeer, r torchRun) []*torchPeer {
	t.Helper()
	waitScriptStep(t, peers[0], 50)
	running := slices.Clone(peers)
	for _, p := range running {
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	cont := func() {
		for _, p := range running {
			p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer cont()
	r.boot = peers[0].d.addr
	peers = append(peers, startTorchPeer(t, r))
	var ds []*proc
	for _, p := range running {
		ds = append(ds, p.d)
	}
	eventually(t, 2*time.Minute, "the joiner in the running peers' ring", func() error {
		return sameRing(ds, len(peers))
	})
	return peers
}

// TestTorchBridgeLateJoiner: a peer that joins a running cluster gets the
// state (parameters, optimizer, step) from a live peer's script through
// the daemons, and ends identical to the others (joinPaused keeps the
// running peers from finishing first).
func TestTorchBridgeLateJoiner(t *testing.T) {
	requireTorch(t)
	const steps = 300
	// The LR scheduler's state travels with the model's: a joiner whose
	// cosine schedule started at step 0 would fork the replicas.
	r := torchRun{steps: steps, minPeers: 2, script: []string{"--schedule", "cosine", "--clip-norm", "1.0"}}
	peers := startTorchCluster(t, 2, r)
	peers = joinPaused(t, peers, r)
	sameHashes(t, peers, steps)
	if !strings.Contains(peers[2].d.stder.String(), "training state synchronised") {
		t.Fatal("the joiner did not adopt a peer's state")
	}
}

// TestTorchBridgeRefusesOtherSettings: scripts with different settings do
// not train together; the one in the minority stops with an error naming
// the key, in its daemon and as a LayoutMismatch in the script.
func TestTorchBridgeRefusesOtherSettings(t *testing.T) {
	requireTorch(t)
	a := startTorchPeer(t, torchRun{steps: 20, minPeers: 2})
	b := startTorchPeer(t, torchRun{steps: 20, minPeers: 2, boot: a.d.addr, script: []string{"--lr", "0.1"}})
	loser := firstToStop(t, a, b)
	if d := loser.d.stder.String(); loser.d.err == nil || !strings.Contains(d, "external.lr") {
		t.Fatalf("the refused daemon exited with %v and did not name external.lr:\n%s", loser.d.err, d)
	}
	if s := loser.stderr.String(); !strings.Contains(s, "LayoutMismatch") || !strings.Contains(s, "external.lr") {
		t.Fatalf("the refused script did not raise LayoutMismatch naming external.lr:\n%s", s)
	}
}

// TestTorchBridgeNamesTheParameterThatDiffers: scripts whose models differ
// do not train together, and the one in the minority stops naming the
// parameter whose shape differs, which its daemon learnt from a peer that
// holds the cluster's layout.
func TestTorchBridgeNamesTheParameterThatDiffers(t *testing.T) {
	requireTorch(t)
	a := startTorchPeer(t, torchRun{steps: 20, minPeers: 2, script: []string{"--model", "mlp", "--hidden", "32"}})
	b := startTorchPeer(t, torchRun{steps: 20, minPeers: 2, boot: a.d.addr, script: []string{"--model", "mlp", "--hidden", "48"}})
	loser := firstToStop(t, a, b)
	want := regexp.MustCompile(`the layouts differ: \\?"0\.weight\\?" has shape \[(32|48) 784\] here, \[(32|48) 784\] in the cluster's`)
	if d := loser.d.stder.String(); loser.d.err == nil || !want.MatchString(d) {
		t.Fatalf("the refused daemon exited with %v and did not name the parameter:\n%s", loser.d.err, d)
	}
	if s := loser.stderr.String(); !strings.Contains(s, "LayoutMismatch") || !want.MatchString(s) {
		t.Fatalf("the refused script did not raise LayoutMismatch naming the parameter:\n%s", s)
	}
}

// firstToStop returns whichever of a and b saw its daemon exit first,
// once its script has exited too.
func firstToStop(t *testing.T, a, b *torchPeer) *torchPeer {
	t.Helper()
	var loser *torchPeer
	select {
	case <-a.d.done:
		loser = a
	case <-b.d.done:
		loser = b
	case <-time.After(2 * time.Minute):
		t.Fatal("neither daemon refused the other")
	}
	<-loser.done
	return loser
}
