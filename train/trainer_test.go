package train

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/node/nodetest"
	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/probe"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// These tests train a small mlp on a slice of Fashion-MNIST (Debian's
// dataset-fashion-mnist, installed by scripts/setup.sh) with in-process peers.

// fashion is the dataset, loaded once and shared read-only by every peer.
var fashion struct {
	once        sync.Once
	train, test *data.Dataset
	err         error
}

func requireDataset(t *testing.T) {
	t.Helper()
	fashion.once.Do(func() { fashion.train, fashion.test, fashion.err = data.LoadFashionMNIST("") })
	if fashion.err != nil {
		t.Fatalf("%v (run scripts/setup.sh)", fashion.err)
	}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return nodetest.Eventually(t, within, what, cond)
}

// stateOn returns p's state in n's view.
func stateOn(n *node.Node, p peer.ID) gossip.State {
	members, _ := n.View()
	for _, m := range members {
		if m.PeerID == p.String() {
			return m.State
		}
	}
	return gossip.Dead
}

// trainConfig is a fast training setup: a small mlp, small batches, a slice of the data.
func trainConfig(steps, minPeers int, bootstrap ...string) config.Config {
	cfg := nodetest.Config(bootstrap...)
	cfg.Train.Steps = steps
	cfg.Train.MinPeers = minPeers
	cfg.Train.Hidden = []int{64}
	cfg.Train.BatchSize = 16
	cfg.Train.TrainSamples = 4096
	cfg.Train.EvalSamples = 500
	cfg.Train.EvalEvery = 0
	cfg.Train.CheckEvery = 5
	cfg.Train.WarmupSteps = 5
	cfg.Train.LowRankWarmupSteps = 0
	cfg.Train.LR = 0.1
	cfg.Allreduce.ChunkBytes = 16 << 10
	cfg.Allreduce.BucketBytes = 64 << 10
	return cfg
}

type trainPeer struct {
	n      *node.Node
	tr     *Trainer
	cancel context.CancelFunc
	done   chan struct{}
	res    Result
	err    error

	mu       sync.Mutex
	progress []Progress
	// timeline holds the trainer's telemetry records.
	timeline *telemetry.History
}

func startTrainer(t *testing.T, cfg config.Config, onProgress func(*trainPeer, Progress)) *trainPeer {
	t.Helper()
	return startTrainerHook(t, cfg, onProgress, nil)
}

// startTrainerHook is startTrainer with a hook on every local gradient bucket.
func startTrainerHook(t *testing.T, cfg config.Config, onProgress func(*trainPeer, Progress), gradHook func(uint64, int, []float32)) *trainPeer {
	t.Helper()
	return startTrainerWrapped(t, cfg, onProgress, gradHook, nil)
}

// startTrainerWrapped is startTrainerHook whose trainer sees the node
// through wrap (nil: directly), for peers that misbehave.
func startTrainerWrapped(t *testing.T, cfg config.Config, onProgress func(*trainPeer, Progress), gradHook func(uint64, int, []float32), wrap func(*node.Node) Cluster) *trainPeer {
	t.Helper()
	return startTrainerOptions(t, cfg, onProgress, gradHook, wrap, nil)
}

// startTrainerOptions is startTrainerWrapped with edit applied to the
// trainer's Options (nil: none).
func startTrainerOptions(t *testing.T, cfg config.Config, onProgress func(*trainPeer, Progress), gradHook func(uint64, int, []float32), wrap func(*node.Node) Cluster, edit func(*Options)) *trainPeer {
	t.Helper()
	n, err := node.New(context.Background(), cfg, nodetest.Logger(t, cfg))
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { n.Kill() })
	p := &trainPeer{n: n, done: make(chan struct{}), timeline: telemetry.NewHistory(1 << 14)}
	var c Cluster = n
	if wrap != nil {
		c = wrap(n)
	}
	o := Options{
		Log: nodetest.Logger(t, cfg),
		Progress: func(pr Progress) {
			p.mu.Lock()
			p.progress = append(p.progress, pr)
			p.mu.Unlock()
			if onProgress != nil {
				onProgress(p, pr)
			}
		},
		Linger:    cfg.Train.ReadyTimeout.D() + 2*cfg.Gossip.FailureTimeout.D(),
		Train:     fashion.train,
		Test:      fashion.test,
		GradHook:  gradHook,
		Telemetry: p.timeline,
	}
	if edit != nil {
		edit(&o)
	}
	tr, err := New(c, cfg.Train, cfg.Allreduce, o)
	if err != nil {
		t.Fatalf("trainer: %v", err)
	}
	p.tr = tr
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() {
		defer close(p.done)
		defer tr.Close()
		p.res, p.err = tr.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// holdFirstStep returns a gradient hook that holds step 0 until the node
// in first has adopted a ring epoch of at least size members (at most 20 s),
// so that a run with a low train.min_peers still starts with everyone.
func holdFirstStep(first *atomic.Pointer[node.Node], size int) func(uint64, int, []float32) {
	return func(step uint64, bucket int, _ []float32) {
		if step != 0 || bucket != 0 {
			return
		}
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(pollInterval) {
			if n := first.Load(); n != nil {
				if _, ep := n.View(); len(ep.Order) >= size {
					return
				}
			}
		}
	}
}

// bootstrapTo returns the bootstrap address of the first started peer (none
// for the first peer itself).
func bootstrapTo(peers []*trainPeer) []string {
	if len(peers) == 0 {
		return nil
	}
	return []string{peers[0].n.AddrStrings()[0]}
}

func (p *trainPeer) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("peer %s did not finish within %s", p.n.ID(), within)
	}
}

// sameResult checks that every peer finished at steps with one parameter hash.
func sameResult(t *testing.T, peers []*trainPeer, steps uint64) Result {
	t.Helper()
	for _, p := range peers {
		if p.err != nil {
			t.Fatalf("peer %s: %v", p.n.ID(), p.err)
		}
		if p.res.Step != steps || p.res.ParamHash != peers[0].res.ParamHash {
			t.Fatalf("peer %s ended at step %d with hash %s; peer %s at %d with %s", p.n.ID(), p.res.Step, p.res.ParamHash,
				peers[0].n.ID(), peers[0].res.Step, peers[0].res.ParamHash)
		}
	}
	return peers[0].res
}

func meanLoss(ps []Progress) float64 {
	s := 0.0
	for _, p := range ps {
		s += p.Loss
	}
	return s / float64(len(ps))
}

func TestTrainIdenticalReplicas(t *testing.T) {
	requireDataset(t)
	for _, tc := range []struct {
		peers   int
		codec   string
		devices []string
	}{{2, "none", nil}, {4, "sint8", nil}, {2, "qsgd:bits=4", []string{"cpu:0", "cpu:1"}}, {3, "powersgd:rank=4", nil}} {
		t.Run(fmt.Sprintf("%d peers %s %d devices", tc.peers, tc.codec, max(1, len(tc.devices))), func(t *testing.T) {
			const steps = 40
			var peers []*trainPeer
			for i := 0; i < tc.peers; i++ {
				boot := bootstrapTo(peers)
				cfg := trainConfig(steps, tc.peers, boot...)
				cfg.Allreduce.Codec = tc.codec
				if tc.devices != nil {
					cfg.Train.Devices = tc.devices
				}
				peers = append(peers, startTrainer(t, cfg, nil))
			}
			for _, p := range peers {
				p.wait(t, 60*time.Second)
			}
			res := sameResult(t, peers, steps)
			pr := peers[0].progress
			first, last := meanLoss(pr[:8]), meanLoss(pr[len(pr)-8:])
			if !(last < 0.8*first) {
				t.Fatalf("training loss did not fall: first steps %.3f, last steps %.3f", first, last)
			}
			t.Logf("%d peers, %s: loss %.3f → %.3f, test accuracy %.3f, hash %s", tc.peers, tc.codec, first, last, res.Accuracy, res.ParamHash[:16])
		})
	}
}

// modes are the training modes the churn tests run under: all-reduce every
// step, and DiLoCo with H = 2, plain and overlapped (steps and hooks then
// count outer steps).
var modes = []struct {
	name   string
	config func(steps, minPeers int, bootstrap ...string) config.Config
}{
	{"per step", trainConfig},
	{"DiLoCo H=2", diLoCoConfig(false)},
	{"DiLoCo H=2 overlapped", diLoCoConfig(true)},
}

func diLoCoConfig(overlap bool) func(steps, minPeers int, bootstrap ...string) config.Config {
	return func(steps, minPeers int, bootstrap ...string) config.Config {
		cfg := trainConfig(2*steps, minPeers, bootstrap...)
		cfg.Train.SyncEvery = 2
		cfg.Train.Optimizer, cfg.Train.LR = "adamw", 0.003
		cfg.Train.OuterMomentum, cfg.Train.OuterOverlap = 0.5, overlap
		return cfg
	}
}

func TestTrainSurvivesKilledPeer(t *testing.T) {
	requireDataset(t)
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { survivesKilledPeer(t, mode.config) })
	}
}

func survivesKilledPeer(t *testing.T, config func(int, int, ...string) config.Config) {
	const steps = 40
	var peers []*trainPeer
	var killOnce sync.Once
	var first atomic.Pointer[node.Node]
	for i := 0; i < 3; i++ {
		boot := bootstrapTo(peers)
		var hook func(*trainPeer, Progress)
		if i == 2 {
			hook = func(p *trainPeer, pr Progress) {
				if pr.Step == 10 {
					killOnce.Do(func() {
						go func() { // crash: no departure announced
							p.cancel()
							p.n.Kill()
						}()
					})
				}
			}
		}
		// min_peers 2 lets the survivors go on; the first step waits for the
		// ring of all three.
		p := startTrainerHook(t, config(steps, 2, boot...), hook, holdFirstStep(&first, 3))
		first.CompareAndSwap(nil, p.n)
		peers = append(peers, p)
	}
	for _, p := range peers[:2] {
		p.wait(t, 60*time.Second)
	}
	res := sameResult(t, peers[:2], steps)
	// The operator sees why: a survivor's timeline records the failed step.
	recs, _ := peers[0].timeline.Since(0)
	if !slices.ContainsFunc(recs, func(r telemetry.Record) bool { return r.Event == telemetry.EventStepFailed }) &&
		!slices.ContainsFunc(recs, func(r telemetry.Record) bool { return r.Event == telemetry.EventResync }) {
		t.Errorf("a survivor's timeline records no failed step nor re-sync after a member died")
	}
	t.Logf("2 survivors finished with hash %s", res.ParamHash[:16])
}

func TestTrainLateJoinerSyncs(t *testing.T) {
	requireDataset(t)
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { lateJoinerSyncs(t, mode.config) })
	}
}

func lateJoinerSyncs(t *testing.T, trainConfig func(int, int, ...string) config.Config) {
	const steps = 60
	first := startTrainer(t, trainConfig(steps, 2), nil)
	boot := first.n.AddrStrings()[0]
	var joiner *trainPeer
	joined := make(chan struct{})
	var once sync.Once
	// At step 15 the second peer starts the joiner and holds its training until
	// the joiner is a member, so the joiner arrives mid-run however fast steps are.
	second := startTrainer(t, trainConfig(steps, 2, boot), func(p *trainPeer, pr Progress) {
		if pr.Step != 15 {
			return
		}
		once.Do(func() {
			// min_peers 3: a joiner that has not yet heard of the cluster must not
			// start a ring of its own.
			joiner = startTrainer(t, trainConfig(steps, 3, boot), nil)
			close(joined)
			eventually(t, 20*time.Second, "joiner is a member", func() error {
				if st := stateOn(p.n, joiner.n.ID()); st != gossip.Alive {
					return fmt.Errorf("joiner is %v", st)
				}
				return nil
			})
		})
	})
	<-joined
	for _, p := range []*trainPeer{first, second, joiner} {
		p.wait(t, 60*time.Second)
	}
	sameResult(t, []*trainPeer{first, second, joiner}, steps)
	joiner.mu.Lock()
	firstStep := joiner.progress[0].Step
	joiner.mu.Unlock()
	if firstStep <= 15 {
		t.Fatalf("joiner's first step was %d: it did not take over the cluster's state", firstStep)
	}
	t.Logf("joiner entered at step %d and finished with the others' hash", firstStep)
}

func TestTrainCheckpointRestart(t *testing.T) {
	requireDataset(t)
	const steps = 20
	dir := t.TempDir()
	ids := []string{filepath.Join(dir, "a.key"), filepath.Join(dir, "b.key")}
	for _, p := range ids {
		if _, err := node.WriteIdentity(p); err != nil {
			t.Fatal(err)
		}
	}
	run := func(ckpt string, stopAt uint64) []*trainPeer {
		var peers []*trainPeer
		stopped := make(chan struct{})
		var once sync.Once
		for i, id := range ids {
			boot := bootstrapTo(peers)
			cfg := trainConfig(steps, 2, boot...)
			cfg.Node.Identity = id
			// The runs are compared bit for bit, so no run may move to
			// per-link fp16 because a probe of loopback measured one
			// direction slower: the codecs must not depend on timing.
			cfg.Allreduce.LinkCodecs = plan.LinkCodecsOff
			if ckpt != "" {
				cfg.Train.CheckpointDir = filepath.Join(ckpt, fmt.Sprint(i))
				cfg.Train.CheckpointEvery = 10
			}
			var hook func(*trainPeer, Progress)
			if stopAt > 0 {
				hook = func(p *trainPeer, pr Progress) {
					if pr.Step == stopAt {
						p.cancel() // stop this peer before its next step
						once.Do(func() { close(stopped) })
					}
				}
			}
			peers = append(peers, startTrainer(t, cfg, hook))
		}
		if stopAt > 0 {
			<-stopped
			for _, p := range peers {
				p.cancel()
				<-p.done
				p.n.Close()
			}
		} else {
			for _, p := range peers {
				p.wait(t, 60*time.Second)
			}
		}
		return peers
	}
	ref := sameResult(t, run("", 0), steps)
	ckpt := t.TempDir()
	for _, p := range run(ckpt, 13) {
		if !errors.Is(p.err, context.Canceled) {
			t.Fatalf("interrupted run: %v", p.err)
		}
	}
	resumed := run(ckpt, 0)
	got := sameResult(t, resumed, steps)
	if got.ParamHash != ref.ParamHash {
		t.Fatalf("resumed run ended with %s, uninterrupted run with %s", got.ParamHash, ref.ParamHash)
	}
	if s := resumed[0].progress[0].Step; s != 11 {
		t.Fatalf("resumed run's first step was %d, want 11 (after the step-10 checkpoint)", s)
	}
	t.Logf("checkpoint at step 10 → restart → step %d with the uninterrupted run's hash %s", steps, got.ParamHash[:16])
}

// TestTrainNonFiniteGradients: a peer whose local gradient holds NaN sends
// zeros instead; an averaged gradient that overflows to Inf is applied by
// no peer and not counted: the step is retried, and replicas stay identical.
// (Such a step was once counted, so a run could end having skipped steps.)
func TestTrainNonFiniteGradients(t *testing.T) {
	requireDataset(t)
	const steps = 20
	var peers []*trainPeer
	attempts := make([]atomic.Int32, 2) // per peer: local gradients computed for step 9
	for i := 0; i < 2; i++ {
		boot := bootstrapTo(peers)
		hook := func(step uint64, bucket int, g []float32) {
			switch {
			case step == 5 && i == 1:
				g[0] = float32(math.NaN()) // local NaN on one peer
			case step == 9 && bucket == 0 && attempts[i].Add(1) == 1:
				g[0] = math.MaxFloat32 // both peers, first attempt: the sum overflows to +Inf
			}
		}
		peers = append(peers, startTrainerHook(t, trainConfig(steps, 2, boot...), nil, hook))
	}
	for _, p := range peers {
		p.wait(t, time.Minute)
	}
	sameResult(t, peers, steps)
	for i, p := range peers {
		p.mu.Lock()
		var tens int
		for _, pr := range p.progress {
			if pr.Step == 10 {
				tens++
			}
		}
		p.mu.Unlock()
		if n := attempts[i].Load(); n != 2 || tens != 1 {
			t.Fatalf("peer %s computed step 9 %d times and completed it %d times, want 2 and 1", p.n.ID(), n, tens)
		}
	}
}

// TestTrainStopsOnPersistentNonFiniteAverage: an average that is not
// finite at every attempt of a step stops the run with an error that says
// so, instead of training on (or skipping steps) forever.
func TestTrainStopsOnPersistentNonFiniteAverage(t *testing.T) {
	requireDataset(t)
	var peers []*trainPeer
	for range 2 {
		hook := func(step uint64, bucket int, g []float32) {
			if step == 3 && bucket == 0 {
				g[0] = math.MaxFloat32
			}
		}
		peers = append(peers, startTrainerHook(t, trainConfig(10, 2, bootstrapTo(peers)...), nil, hook))
	}
	for _, p := range peers {
		p.wait(t, time.Minute)
		if p.err == nil || !strings.Contains(p.err.Error(), "averaged gradient is not finite") || !strings.Contains(p.err.Error(), "3 times in a row") {
			t.Fatalf("peer %s: %v, want the run stopped after 3 non-finite averages", p.n.ID(), p.err)
		}
	}
}

// TestTrainParamHashMismatchResyncs: one peer's parameters are corrupted
// behind the ring's back; the gossiped hash check finds it and the peers end
// identical again (the one that differs from the coordinator re-syncs from it).
func TestTrainParamHashMismatchResyncs(t *testing.T) {
	requireDataset(t)
	const steps = 30
	var peers []*trainPeer
	for i := 0; i < 2; i++ {
		boot := bootstrapTo(peers)
		var hook func(uint64, int, []float32)
		if i == 1 {
			var p *trainPeer
			hook = func(step uint64, bucket int, _ []float32) {
				if step == 12 && bucket == 0 {
					p.tr.l.(*ModelLearner).Model().Params()[0] += 1 // a silent divergence
				}
			}
			peers = append(peers, startTrainerHook(t, trainConfig(steps, 2, boot...), nil, hook))
			p = peers[1]
			continue
		}
		peers = append(peers, startTrainerHook(t, trainConfig(steps, 2, boot...), nil, nil))
	}
	for _, p := range peers {
		p.wait(t, time.Minute)
	}
	sameResult(t, peers, steps)
	// Whichever peer is not the coordinator differs from it after the
	// corruption: it must have detected the mismatch and adopted the
	// coordinator's state.
	var mismatches, syncs int
	for _, p := range peers {
		mismatches += p.tr.mismatches
		syncs += p.tr.syncs
	}
	if mismatches < 1 || syncs < 1 {
		t.Fatalf("%d hash mismatches detected and %d states adopted; want at least one of each", mismatches, syncs)
	}
}

// faultyGPU is a stand-in "cuda" device: the CPU device whose Synchronize
// reports a deferred fault from its failAt-th call on, as a CUDA context does
// after a kernel fault.
type faultyGPU struct {
	*gpu.CPU
	calls, failAt int
}

func (d *faultyGPU) Name() string { return "cuda:0 (stand-in)" }

func (d *faultyGPU) Synchronize() error {
	d.calls++
	if d.calls >= d.failAt {
		return errors.New("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
	}
	return nil
}

var registerFaultyGPU sync.Once

// TestTrainDeviceFailureStops: a device fault is not retried like a network
// failure. The peer whose GPU failed stops with an error naming the device
// and the step; the other peer goes on and finishes alone.
func TestTrainDeviceFailureStops(t *testing.T) {
	requireDataset(t)
	const steps = 30
	registerFaultyGPU.Do(func() {
		gpu.RegisterOpener("cuda", func(gpu.Spec) ([]gpu.Device, error) {
			return []gpu.Device{&faultyGPU{CPU: gpu.NewCPU(0), failAt: 8}}, nil
		})
	})
	// min_peers 1 lets the healthy peer finish alone; its first step waits
	// for the ring of both.
	var first atomic.Pointer[node.Node]
	healthy := startTrainerHook(t, trainConfig(steps, 1), nil, holdFirstStep(&first, 2))
	first.Store(healthy.n)
	cfg := trainConfig(steps, 2, bootstrapTo([]*trainPeer{healthy})...)
	cfg.Train.Devices = []string{"cuda:0"}
	faulty := startTrainer(t, cfg, nil)

	faulty.wait(t, time.Minute)
	var de *model.DeviceError
	if !errors.As(faulty.err, &de) || de.Device != "cuda:0 (stand-in)" || !strings.Contains(faulty.err.Error(), "ILLEGAL_ADDRESS") ||
		!regexp.MustCompile(`training stopped at step \d+`).MatchString(faulty.err.Error()) {
		t.Fatalf("faulty peer: err = %v, want a *model.DeviceError naming the device, the fault and the step", faulty.err)
	}
	faulty.n.Close() // as `p2ptrain join` does when training fails: leave the cluster
	healthy.wait(t, time.Minute)
	if healthy.err != nil || healthy.res.Step != steps {
		t.Fatalf("healthy peer: step %d, err %v; want it to finish all %d steps alone", healthy.res.Step, healthy.err, steps)
	}
}

// TestTrainPerLinkCodecs: three peers start training on a ring of uniform
// codecs; injected link figures make one peer slow, the coordinator re-plans
// with fp16 on that peer's links, and training goes on in the new epoch with
// every replica still identical.
func TestTrainPerLinkCodecs(t *testing.T) {
	requireDataset(t)
	const steps, w = 40, 3
	injected := make(chan struct{})
	var nodes []*node.Node // written before injected is closed
	hook := func(step uint64, bucket int, g []float32) {
		if step != 0 || bucket != 0 {
			return
		}
		// Hold the first step until the per-link epoch is adopted here, so
		// that most steps run in it.
		<-injected
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if _, ep := nodes[0].View(); ep.LinkCodecs != nil {
				return
			}
			time.Sleep(pollInterval)
		}
	}
	var peers []*trainPeer
	for range w {
		cfg := trainConfig(steps, w, bootstrapTo(peers)...)
		cfg.Probe.Enabled = false
		cfg.Allreduce.Schedule = "ring"
		peers = append(peers, startTrainerHook(t, cfg, nil, hook))
	}
	for _, p := range peers {
		nodes = append(nodes, p.n)
	}
	slow := peers[0].n.ID().String()
	now := time.Now()
	for _, p := range peers {
		for _, q := range peers {
			if p == q {
				continue
			}
			mbit := 1000.0
			if p.n.ID().String() == slow || q.n.ID().String() == slow {
				mbit = 100
			}
			p.n.InjectLink(probe.LinkStatus{Peer: q.n.ID().String(), MbitS: mbit, RTTMs: 0.2, MeasuredAt: now})
		}
	}
	close(injected)
	for _, p := range peers {
		p.wait(t, 90*time.Second)
	}
	res := sameResult(t, peers, steps)
	_, ep := peers[1].n.View()
	if ep.FinalCodec != "fp16" || len(ep.LinkCodecs) != w {
		t.Fatalf("final epoch %+v: want per-link codecs with an fp16 all-gather", ep)
	}
	for k, id := range ep.Order {
		want := "none"
		if id == slow || ep.Order[(k+1)%w] == slow {
			want = "fp16"
		}
		if ep.LinkCodecs[k] != want {
			t.Fatalf("epoch %+v: edge %d from %s has %s, want %s", ep, k, id, ep.LinkCodecs[k], want)
		}
	}
	pr := peers[0].progress
	inLinks := 0
	for _, p := range pr {
		if p.Epoch == ep.Number {
			inLinks++
		}
	}
	if inLinks < steps/2 {
		t.Fatalf("only %d of %d steps ran in the per-link epoch %d", inLinks, steps, ep.Number)
	}
	first, last := meanLoss(pr[:8]), meanLoss(pr[len(pr)-8:])
	if !(last < 0.8*first) {
		t.Fatalf("training loss did not fall: first steps %.3f, last steps %.3f", first, last)
	}
	t.Logf("%d of %d steps with per-link codecs %v: loss %.3f → %.3f, hash %s", inLinks, steps, ep.LinkCodecs, first, last, res.ParamHash[:16])
}

// TestTrainRefusesDifferentSettings: two peers with different momentum
// never step together; the one whose settings lose (a tie goes to the
// coordinator's) stops before its first step with an error naming the key.
func TestTrainRefusesDifferentSettings(t *testing.T) {
	requireDataset(t)
	a := startTrainer(t, trainConfig(20, 2), nil)
	cfg := trainConfig(20, 2, a.n.AddrStrings()[0])
	cfg.Train.Momentum = 0.5
	b := startTrainer(t, cfg, nil)
	var loser, other *trainPeer
	select {
	case <-a.done:
		loser, other = a, b
	case <-b.done:
		loser, other = b, a
	case <-time.After(60 * time.Second):
		t.Fatal("neither peer refused the other's settings")
	}
	if !errors.Is(loser.err, ErrSettingsDiffer) || !strings.Contains(loser.err.Error(), "train.momentum") {
		t.Fatalf("err = %v, want one naming train.momentum", loser.err)
	}
	other.cancel()
	<-other.done
	for _, p := range []*trainPeer{a, b} {
		p.mu.Lock()
		n := len(p.progress)
		p.mu.Unlock()
		if n != 0 {
			t.Fatalf("peer %s ran %d steps with mismatched settings", p.n.ID(), n)
		}
	}
}

// TestTrainUnequalDevicesMatchEqualShards: a cluster of one 2-device peer
// and two 1-device peers trains as four 1-device peers do: every step's
// samples are the same global batch, split without overlap, and the
// average weighs each peer by its samples (it once drew overlapping
// samples and averaged the peers with equal weights).
func TestTrainUnequalDevicesMatchEqualShards(t *testing.T) {
	requireDataset(t)
	const steps = 15
	run := func(devices [][]string) []float32 {
		var peers []*trainPeer
		for _, d := range devices {
			cfg := trainConfig(steps, len(devices), bootstrapTo(peers)...)
			cfg.Train.Devices = d
			cfg.Allreduce.LinkCodecs = plan.LinkCodecsOff
			peers = append(peers, startTrainer(t, cfg, nil))
		}
		for _, p := range peers {
			p.wait(t, time.Minute)
		}
		sameResult(t, peers, steps)
		return slices.Clone(peers[0].tr.l.(*ModelLearner).Model().Params())
	}
	one := []string{"cpu:0"}
	mixed := run([][]string{{"cpu:0", "cpu:1"}, one, one})
	equal := run([][]string{one, one, one, one})
	worst := 0.0
	for i := range mixed {
		worst = max(worst, math.Abs(float64(mixed[i]-equal[i])))
	}
	// Only the order of floating-point sums differs between the two runs.
	if worst > 1e-4 {
		t.Fatalf("parameters differ by up to %g after %d steps", worst, steps)
	}
	t.Logf("largest parameter difference after %d steps: %g", steps, worst)
}

// silentCluster is a member that heartbeats and announces itself ready but
// never sends an all-reduce frame.
type silentCluster struct{ *node.Node }

func (c silentCluster) OpenTransport(r allreduce.Ring) allreduce.EpochTransport {
	return silentTransport{c.Node.OpenTransport(r)}
}

type silentTransport struct{ allreduce.EpochTransport }

func (silentTransport) Send(context.Context, allreduce.PeerID, []byte) error { return nil }

// TestTrainExcludesSilentMember: a member that heartbeats but never sends
// frames is blamed by the frame timeouts, excluded after
// train.exclude_after failed steps, and the others finish without it.
// (Every step once timed out and was retried with it, forever.)
func TestTrainExcludesSilentMember(t *testing.T) {
	requireDataset(t)
	const steps = 20
	var peers []*trainPeer
	for i := range 4 {
		cfg := trainConfig(steps, 3, bootstrapTo(peers)...)
		cfg.Allreduce.FrameTimeout = config.Duration(time.Second)
		var wrap func(*node.Node) Cluster
		if i == 0 { // the first: it is in every ring the others can form
			wrap = func(n *node.Node) Cluster { return silentCluster{n} }
		}
		peers = append(peers, startTrainerWrapped(t, cfg, nil, nil, wrap))
	}
	silent, honest := peers[0], peers[1:]
	for _, p := range honest {
		p.wait(t, 2*time.Minute)
	}
	sameResult(t, honest, steps)
	// The peers that blamed it exclude it (the coordinator of the last epoch
	// among them); the others may simply follow that coordinator.
	excluders := 0
	for _, p := range honest {
		members, ep := p.n.View()
		if slices.Contains(ep.Order, silent.n.ID().String()) {
			t.Fatalf("the silent member is still in ring epoch %d", ep.Number)
		}
		for _, m := range members {
			if m.PeerID == silent.n.ID().String() && !m.ExcludedUntil.IsZero() {
				excluders++
			}
		}
	}
	if excluders == 0 {
		t.Fatal("no peer excludes the silent member")
	}
}

// poisonCluster claims to be 5 steps ahead of the state it holds, with a
// made-up parameter hash, and serves parameters full of NaN.
type poisonCluster struct{ *node.Node }

func (c poisonCluster) Announce(payload []byte, step uint64) {
	if pl, err := DecodePayload(payload); err == nil && pl.Ready != nil {
		pl.Ready.Step += 5
		pl.Ready.Hash = strings.Repeat("0", 64)
		payload = pl.Encode()
	}
	c.Node.Announce(payload, step+5)
}

func (c poisonCluster) ServeState(src func(from string, step uint64) ([]byte, error)) {
	if src == nil {
		c.Node.ServeState(nil)
		return
	}
	c.Node.ServeState(func(from string, step uint64) ([]byte, error) {
		b, err := src(from, step-5) // the state it really holds
		if err != nil {
			return nil, err
		}
		ck, err := model.UnmarshalCheckpoint(b)
		if err != nil {
			return nil, err
		}
		nan := math.Float32bits(float32(math.NaN()))
		for i := 0; i+4 <= len(ck.Params); i += 4 {
			binary.LittleEndian.PutUint32(ck.Params[i:], nan)
		}
		ck.Step = int64(step)
		return ck.Marshal(), nil
	})
}

// TestTrainExcludesPoisonedStateServer: a member that claims the most
// advanced state and serves NaN is refused and, having served an invalid
// state, excluded at once, so the others train on from their own state.
// (Its state was once refused and asked for again, forever.) The poisoner
// and two honest peers start, with train.min_peers = 3, so that the first
// epoch that trains holds the poisoner (with a third honest peer from the
// start, the three honest ones sometimes formed that epoch before they
// saw the poisoner, trained, and outvoted its claim: nobody asked it for
// its state); once both exclude it, a third honest peer joins them.
func TestTrainExcludesPoisonedStateServer(t *testing.T) {
	requireDataset(t)
	const steps = 20
	poisoner := startTrainerWrapped(t, trainConfig(steps, 3), nil, nil, func(n *node.Node) Cluster { return poisonCluster{n} })
	peers := []*trainPeer{poisoner}
	for range 2 {
		peers = append(peers, startTrainer(t, trainConfig(steps, 3, bootstrapTo(peers)...), nil))
	}
	excludes := func(p *trainPeer) bool {
		ms, _ := p.n.View()
		return slices.ContainsFunc(ms, func(m gossip.Member) bool {
			return m.PeerID == poisoner.n.ID().String() && !m.ExcludedUntil.IsZero()
		})
	}
	deadline := time.Now().Add(time.Minute)
	for !excludes(peers[1]) || !excludes(peers[2]) {
		if time.Now().After(deadline) {
			t.Fatal("the honest peers did not exclude the member that served NaN within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	peers = append(peers, startTrainer(t, trainConfig(steps, 3, bootstrapTo(peers[1:])...), nil))
	honest := peers[1:]
	for _, p := range honest {
		p.wait(t, 2*time.Minute)
	}
	sameResult(t, honest, steps)
}

// TestTrainStopsWhenTheModelDiverges: a member that sends −10⁴ times its
// gradient (finite, so no non-finite check fires) wrecks a plain average;
// the run stops with an error that says the model diverged, instead of a
// done line with loss=NaN (the chaos suite's attack without
// allreduce.robust once ended that way).
func TestTrainStopsWhenTheModelDiverges(t *testing.T) {
	requireDataset(t)
	var peers []*trainPeer
	for i := range 2 {
		hook := func(_ uint64, _ int, g []float32) {
			if i == 1 {
				for k := range g {
					g[k] *= -1e4
				}
			}
		}
		peers = append(peers, startTrainerHook(t, trainConfig(30, 2, bootstrapTo(peers)...), nil, hook))
	}
	for _, p := range peers {
		p.wait(t, time.Minute)
		t.Logf("peer %s: %v", p.n.ID(), p.err)
		if p.err == nil || !strings.Contains(p.err.Error(), "the model diverged") {
			t.Fatalf("peer %s: err %v, want the run stopped as diverged", p.n.ID(), p.err)
		}
	}
}

// TestTrainerSaysItWaitsForPeers: a trainer alone in its ring with
// train.min_peers = 2 reports why it waits (Status.Waiting, shown in
// /status as trainer_waiting) at 0 samples/s; it stops saying so while a
// second peer lets it train, and says so again, at 0 samples/s rather than
// its last rate, once that peer leaves.
func TestTrainerSaysItWaitsForPeers(t *testing.T) {
	requireDataset(t)
	var mu sync.Mutex
	var whys []string
	var trained bool
	record := func(o *Options) {
		o.Status = func(s Status) {
			mu.Lock()
			defer mu.Unlock()
			if len(whys) == 0 || whys[len(whys)-1] != s.Waiting {
				whys = append(whys, s.Waiting)
			}
			if s.Waiting != "" && s.SamplesPerS != 0 {
				t.Errorf("waiting (%s) at %.0f samples/s", s.Waiting, s.SamplesPerS)
			}
			trained = trained || s.Waiting == "" && s.SamplesPerS > 0
		}
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			done := ok()
			mu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: reasons reported %q", what, whys)
			}
		}
	}
	waiting := func() bool {
		return len(whys) > 0 && strings.Contains(whys[len(whys)-1], "has 1 of the 2 members train.min_peers asks for")
	}
	first := startTrainerOptions(t, trainConfig(100000, 2), nil, nil, nil, record)
	until("alone", waiting)
	second := startTrainer(t, trainConfig(100000, 2, bootstrapTo([]*trainPeer{first})...), nil)
	until("with a second peer", func() bool { return trained && whys[len(whys)-1] == "" })
	second.cancel()
	<-second.done
	if err := second.n.Close(); err != nil { // it leaves the cluster
		t.Fatal(err)
	}
	until("after the second peer left", waiting)
}
