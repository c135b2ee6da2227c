package train

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// pipeConfig is gptConfig with the model cut into 2 stages, micro
// micro-batches of the batch each pipeline takes, and activations sent
// exactly.
func pipeConfig(steps, peers, batch, micro int, bootstrap ...string) config.Config {
	cfg := gptConfig(steps, peers, batch, bootstrap...)
	cfg.Train.PipelineStages = 2
	cfg.Train.MicroBatches = micro
	cfg.Train.ActivationCodec = "none"
	return cfg
}

// stagePeer returns p's pipeline learner.
func stagePeer(t *testing.T, p *trainPeer) *PipeLearner {
	t.Helper()
	pl, ok := p.tr.l.(*PipeLearner)
	if !ok {
		t.Fatalf("peer %s trains without pipeline stages", p.n.ID())
	}
	return pl
}

// tensorsByName returns m's parameters by tensor name, a tied head's copy
// of the token table under the table's name in the whole model.
func tensorsByName(m *model.Model) map[string][]float32 {
	out := map[string][]float32{}
	p := m.Params()
	for _, b := range m.Buckets() {
		for _, tn := range b.Tensors {
			name := tn.Name
			if strings.Contains(name, ".tied_head(") {
				name = "tied:wte"
			} else if strings.HasPrefix(name, "0.") && strings.HasSuffix(name, ".wte") {
				name = "tied:wte"
			}
			if _, dup := out[name]; !dup {
				out[name] = p[b.Offset+tn.Offset : b.Offset+tn.Offset+tn.Len]
			}
		}
	}
	return out
}

// stepLosses returns the mean over peers of each step's reported loss.
func stepLosses(ps []*trainPeer, steps int) []float64 {
	sum, n := make([]float64, steps+1), make([]int, steps+1)
	for _, p := range ps {
		p.mu.Lock()
		for _, pr := range p.progress {
			sum[pr.Step] += pr.Loss
			n[pr.Step]++
		}
		p.mu.Unlock()
	}
	out := make([]float64, 0, steps)
	for s := 1; s <= steps; s++ {
		out = append(out, sum[s]/float64(max(n[s], 1)))
	}
	return out
}

// relL2 returns ‖a−b‖₂/‖b‖₂.
func relL2(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		d += (float64(a[i]) - float64(b[i])) * (float64(a[i]) - float64(b[i]))
		n += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / n)
}

// TestPipelineMatchesDataParallel: 4 peers train the tiny gpt as 2
// stages × 2 replicas (each pipeline 8 windows in 2 micro-batches, `none`
// activations, fp32 gradients) and 2 peers train it by pure data
// parallelism on the same global batch of 16 windows. The two compute the
// same sums in another order (micro-batch by micro-batch, the token
// table's two parts added at the end), so the curves agree up to fp32
// summation order, amplified over the steps by AdamW (which divides by
// the root of small second moments). Asserted: every step's mean loss
// within 1e-4 relative (the observed difference is about 1e-6 after 20
// steps; a lost or doubled micro-batch moves the first step's loss by
// about 1e-2), every tensor within 1e-3 relative L2 of the data-parallel
// model's after the last step (observed about 1e-5), the two peers of a
// pipeline reporting the same loss bit for bit, replicas of a stage ending
// bit-identical, and the two copies of the token table equal bit for bit.
// Both evaluate after step 10 and at the end: checkPipelineEval.
func TestPipelineMatchesDataParallel(t *testing.T) {
	const steps, batch = 20, 8
	start := func(peers int, cfg func(boot ...string) config.Config) []*trainPeer {
		var ps []*trainPeer
		for range peers {
			ps = append(ps, startTrainer(t, cfg(bootstrapTo(ps)...), nil))
		}
		for _, p := range ps {
			p.wait(t, 3*time.Minute)
			if p.err != nil {
				t.Fatalf("peer %s: %v", p.n.ID(), p.err)
			}
		}
		return ps
	}
	// A calm run: no re-plans. Loopback's link probes are noise, and a
	// pipeline re-plan they set off moves peers between stages mid-run:
	// the movers load their new stage's state a step ahead and never
	// report the step in between (seen in 1 run of 6 under -race).
	calm := func(cfg config.Config) config.Config {
		cfg.Train.EvalEvery = steps / 2
		cfg.Probe.ReplanInterval = 0
		return cfg
	}
	dp := start(2, func(boot ...string) config.Config { return calm(gptConfig(steps, 2, batch, boot...)) })
	pp := start(4, func(boot ...string) config.Config { return calm(pipeConfig(steps, 4, batch, 2, boot...)) })
	sameResult(t, dp, steps)

	// Stages: replicas bit-identical, and the pipeline's two ends hold
	// the same token table.
	byStage := map[int][]*trainPeer{}
	for _, p := range pp {
		if p.res.Step != steps {
			t.Fatalf("peer %s ended at step %d", p.n.ID(), p.res.Step)
		}
		byStage[stagePeer(t, p).Stage()] = append(byStage[stagePeer(t, p).Stage()], p)
	}
	if len(byStage[0]) != 2 || len(byStage[1]) != 2 {
		t.Fatalf("stages held: %d peers at stage 0, %d at stage 1; want 2 and 2", len(byStage[0]), len(byStage[1]))
	}
	for s, ps := range byStage {
		sameResult(t, ps, steps)
		t.Logf("stage %d: layers %v, hash %s", s, stagePeer(t, ps[0]).Split(), ps[0].res.ParamHash[:16])
	}
	if byStage[0][0].res.ParamHash == byStage[1][0].res.ParamHash {
		t.Fatal("the two stages end with one parameter hash")
	}
	first, last := tensorsByName(stagePeer(t, byStage[0][0]).Model()), tensorsByName(stagePeer(t, byStage[1][0]).Model())
	if !slices.Equal(first["tied:wte"], last["tied:wte"]) || first["tied:wte"] == nil {
		t.Fatal("the first stage's token table and the last stage's copy differ")
	}

	// Every tensor against the data-parallel model's.
	whole := tensorsByName(dp[0].tr.l.(*ModelLearner).Model())
	worst, worstName := 0.0, ""
	seen := 0
	for _, stage := range []map[string][]float32{first, last} {
		for name, v := range stage {
			w, ok := whole[name]
			if !ok || len(w) != len(v) {
				t.Fatalf("tensor %s of a stage is not in the whole model", name)
			}
			if d := relL2(v, w); d > worst {
				worst, worstName = d, name
			}
			seen++
		}
	}
	if seen < len(whole) {
		t.Fatalf("the stages hold %d tensors, the whole model %d", seen, len(whole))
	}
	if worst > 1e-3 {
		t.Fatalf("after %d steps tensor %s differs from data parallelism's by %.2g relative L2 (bound 1e-3)", steps, worstName, worst)
	}

	// The loss curves, and the two peers of a pipeline agreeing on theirs.
	for _, p := range pp {
		p.mu.Lock()
		if len(p.progress) != steps {
			t.Errorf("peer %s reported %d steps, want %d (no retries in a calm run)", p.n.ID(), len(p.progress), steps)
		}
		p.mu.Unlock()
	}
	a, b := stepLosses(dp, steps), stepLosses(pp, steps)
	maxRel := 0.0
	for i := range a {
		rel := math.Abs(a[i]-b[i]) / a[i]
		maxRel = max(maxRel, rel)
		if rel > 1e-4 {
			t.Fatalf("step %d: mean loss %.7f with data parallelism, %.7f with 2×2 pipelines (relative %.2g > 1e-4)", i+1, a[i], b[i], rel)
		}
	}
	losses := map[float64]int{}
	for _, p := range pp {
		p.mu.Lock()
		losses[p.progress[steps-1].Loss]++
		p.mu.Unlock()
	}
	for l, n := range losses {
		if n%2 != 0 {
			t.Fatalf("last step's losses %v: the two stages of a pipeline should report one loss (%v reported %d times)", losses, l, n)
		}
	}
	t.Logf("loss %.4f → %.4f; largest relative difference of a step's mean loss %.2g, of a tensor after %d steps %.2g (%s)",
		a[0], a[steps-1], maxRel, steps, worst, worstName)
	checkPipelineEval(t, dp, pp, []uint64{steps / 2, steps}, first, last)
}

// TestPipelineKilledPeerRetriesAfterJoiner: 4 peers with train.min_peers
// 2 (the default path: a pipeline of 2 starts as soon as 2 peers are
// there, and the others join it) train the gpt in 2 stages; one dies
// mid-run, at its third step in a ring of all four. The step in flight fails on the survivors (their pipeline or
// stage ring names the dead peer) and is not applied; 3 members hold one
// pipeline of 2 stages and leave the third idle, which says so, and the
// pipeline retries the step and trains on. A fifth peer joins: the layout
// of 4 places it and the idle survivor, they (and any survivor the new
// layout moves to another stage) fetch their stage's state. Every peer
// ends at the last step, replicas of a stage bit-identical.
func TestPipelineKilledPeerRetriesAfterJoiner(t *testing.T) {
	const steps, batch = 40, 8
	var ps []*trainPeer
	type kill struct {
		p    *trainPeer
		step uint64
	}
	killed := make(chan kill, 1)
	var once sync.Once
	reported := 0
	for i := range 4 {
		var hook func(*trainPeer, Progress)
		if i == 3 {
			hook = func(p *trainPeer, pr Progress) {
				// Its third step in a ring of all four: killed in a ring of
				// two, the survivor would lack a quorum of the last ring that
				// trained (1 of 2) and rightly wait instead of forking.
				if pr.Peers != 4 {
					return
				}
				if reported++; reported == 3 {
					once.Do(func() {
						go func() { // a crash: no departure announced
							p.cancel()
							p.n.Kill()
							killed <- kill{p, pr.Step}
						}()
					})
				}
			}
		}
		ps = append(ps, startTrainer(t, pipeConfig(steps, 2, batch, 2, bootstrapTo(ps)...), hook))
	}
	k := <-killed
	survivors := ps[:3]
	eventually(t, 30*time.Second, "survivors adopt an epoch without the dead peer", func() error {
		for _, p := range survivors {
			if _, ep := p.n.View(); slices.Contains(ep.Order, k.p.n.ID().String()) || len(ep.Order) != 3 {
				return fmt.Errorf("peer %s is in epoch %d of %d members", p.n.ID(), ep.Number, len(ep.Order))
			}
		}
		return nil
	})
	stepNow := func(p *trainPeer) uint64 {
		p.tr.mu.Lock()
		defer p.tr.mu.Unlock()
		return p.tr.step
	}
	eventually(t, 30*time.Second, "a survivor sits idle in the epoch of 3 members", func() error {
		for _, p := range survivors {
			if p.tr.idleLogged.Load() != 0 {
				return nil
			}
		}
		return errors.New("none is idle")
	})
	held := stepNow(survivors[0])
	// min_peers 4: the joiner must not start a ring of its own.
	joiner := startTrainer(t, pipeConfig(steps, 4, batch, 2, bootstrapTo(ps)...), nil)
	all := append(slices.Clone(survivors), joiner)
	for _, p := range all {
		p.wait(t, 3*time.Minute)
		if p.err != nil {
			t.Fatalf("peer %s: %v", p.n.ID(), p.err)
		}
	}
	idle := 0
	for _, p := range survivors {
		if p.tr.idleLogged.Load() != 0 {
			idle++
		}
	}
	byStage := map[int][]*trainPeer{}
	for _, p := range all {
		if p.res.Step != steps {
			t.Fatalf("peer %s ended at step %d, want %d", p.n.ID(), p.res.Step, steps)
		}
		s := stagePeer(t, p).Stage()
		byStage[s] = append(byStage[s], p)
	}
	if len(byStage[0]) != 2 || len(byStage[1]) != 2 {
		t.Fatalf("stages held at the end: %d and %d peers, want 2 and 2", len(byStage[0]), len(byStage[1]))
	}
	for _, ps := range byStage {
		sameResult(t, ps, steps)
	}
	// The operator sees why: a survivor's timeline records the failed step.
	failed := 0
	for _, p := range survivors {
		recs, _ := p.timeline.Since(0)
		if slices.ContainsFunc(recs, func(r telemetry.Record) bool { return r.Event == telemetry.EventStepFailed }) {
			failed++
		}
	}
	if failed == 0 {
		t.Error("no survivor's timeline records the failed step")
	}
	// A joiner that arrives as the others finish trains no step and ends
	// with its stage's final state (sameResult above); one that trains
	// must start past the step the dead peer took down.
	joiner.mu.Lock()
	trained := len(joiner.progress) > 0
	firstStep := uint64(0)
	if trained {
		firstStep = joiner.progress[0].Step
	}
	joiner.mu.Unlock()
	if trained && firstStep <= k.step {
		t.Fatalf("the joiner's first step was %d: it did not take over its stage's state", firstStep)
	}
	if st := stateOn(survivors[0].n, k.p.n.ID()); st == gossip.Alive {
		t.Errorf("the dead peer is still alive in a survivor's view")
	}
	t.Logf("killed after step %d; the survivors were at step %d when one sat idle (%d idle); the joiner entered at step %d at stage %d; %d survivors recorded the failed step",
		k.step, held, idle, firstStep-1, stagePeer(t, joiner).Stage(), failed)
}

// mlpStagesAndOnePeer trains the mlp for steps steps on one peer, whole,
// and on 2 peers as 2 stages (4 micro-batches, `none` activations, cut at
// split; nil: by parameter counts), and returns the stage peers and the
// step losses of one peer and of the pipeline.
func mlpStagesAndOnePeer(t *testing.T, steps int, split []int) (stages []*trainPeer, one, piped []float64) {
	t.Helper()
	whole := startTrainer(t, trainConfig(steps, 1), nil)
	whole.wait(t, time.Minute)
	for range 2 {
		cfg := trainConfig(steps, 2, bootstrapTo(stages)...)
		cfg.Train.PipelineStages, cfg.Train.MicroBatches, cfg.Train.ActivationCodec = 2, 4, "none"
		cfg.Train.PipelineSplit = split
		stages = append(stages, startTrainer(t, cfg, nil))
	}
	for _, p := range append(stages, whole) {
		p.wait(t, time.Minute)
		if p.err != nil || p.res.Step != uint64(steps) {
			t.Fatalf("peer %s: step %d, %v", p.n.ID(), p.res.Step, p.err)
		}
	}
	return stages, stepLosses([]*trainPeer{whole}, steps), stepLosses(stages, steps)
}

// TestPipelineMLPMatchesOnePeer: the mlp cut in 2 stages on 2 peers (one
// pipeline, 16 images in 4 micro-batches, `none` activations, SGD with
// momentum) follows one peer training it whole on the same batches: every
// step's loss within 1e-5 relative (observed about 1e-7: only the
// micro-batches' summation order differs), and the run learns.
func TestPipelineMLPMatchesOnePeer(t *testing.T) {
	requireDataset(t)
	const steps = 30
	_, a, b := mlpStagesAndOnePeer(t, steps, nil)
	worst := 0.0
	for i := range a {
		worst = max(worst, math.Abs(a[i]-b[i])/a[i])
	}
	if worst > 1e-5 {
		t.Fatalf("the pipelined mlp's step losses differ from one peer's by up to %.2g relative (bound 1e-5): %v vs %v", worst, b, a)
	}
	if !(b[steps-1] < 0.8*b[0]) {
		t.Fatalf("the pipelined mlp did not learn: loss %.3f → %.3f", b[0], b[steps-1])
	}
	t.Logf("mlp in 2 stages: loss %.4f → %.4f, largest relative difference from one peer %.2g", b[0], b[steps-1], worst)
}

// TestPipelineSplitFromConfig: train.pipeline_split cuts the model where
// it says (here the cut that balancing by parameter counts does not
// choose), every stage holds its layers, and the pipeline still follows
// one peer's training step for step.
func TestPipelineSplitFromConfig(t *testing.T) {
	requireDataset(t)
	const steps = 20
	base := trainConfig(steps, 2)
	infos, err := model.Layers("mlp", model.Config{Hidden: base.Train.Hidden})
	if err != nil {
		t.Fatal(err)
	}
	byParams, _, err := pipeline.Balance(pipeline.ParamCosts(infos), 2)
	if err != nil {
		t.Fatal(err)
	}
	split := []int{0, 1, len(infos)}
	if slices.Equal(split, []int(byParams)) {
		split = []int{0, len(infos) - 1, len(infos)}
	}
	ps, a, b := mlpStagesAndOnePeer(t, steps, split)
	for _, p := range ps {
		if got := stagePeer(t, p).Split(); !slices.Equal([]int(got), split) {
			t.Errorf("peer %s cut the model at %v, not train.pipeline_split %v (by parameters: %v)", p.n.ID(), got, split, byParams)
		}
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-5*a[i] {
			t.Fatalf("step %d: loss %v in 2 stages cut at %v, %v on one peer", i+1, b[i], split, a[i])
		}
	}
}

// TestPipelineLinkCodecsFromMeasuredLinks: with
// train.activation_link_codecs = "auto" each stage sends on its links the
// codec their measured rate allows: none once the stage has timed its
// compute when the links are far faster than it, the configured dyn8 when
// they are far slower. The frames carry the byte naming the codec through
// the peers' pipeline protocol.
func TestPipelineLinkCodecsFromMeasuredLinks(t *testing.T) {
	requireDataset(t)
	const steps = 6
	for _, tc := range []struct {
		mbit float64
		want string
	}{{1e12, "none"}, {1e-3, "dyn8:block=2048"}} {
		var ps []*trainPeer
		for range 2 {
			cfg := trainConfig(steps, 2, bootstrapTo(ps)...)
			cfg.Train.PipelineStages, cfg.Train.MicroBatches = 2, 4
			cfg.Train.ActivationCodec, cfg.Train.ActivationLinkCodecs = "dyn8", config.ActivationLinkCodecsAuto
			ps = append(ps, startTrainerWrapped(t, cfg, nil, nil, func(n *node.Node) Cluster { return linkCluster{n, tc.mbit, 1} }))
		}
		for _, p := range ps {
			p.wait(t, time.Minute)
			if p.err != nil || p.res.Step != steps {
				t.Fatalf("links of %g Mbit/s: peer %s: step %d, %v", tc.mbit, p.n.ID(), p.res.Step, p.err)
			}
		}
		got := map[int]string{}
		for _, p := range ps {
			sp := stagePeer(t, p)
			act, grad := sp.LinkCodecs()
			got[sp.Stage()] = act + grad // each stage sends on one side
		}
		if got[0] != tc.want || got[1] != tc.want {
			t.Errorf("links of %g Mbit/s: stage 0 sent activations with %q, stage 1 their gradients with %q; want %q", tc.mbit, got[0], got[1], tc.want)
		}
	}
}
