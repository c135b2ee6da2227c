package pipeline

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/model"
)

func TestLadder(t *testing.T) {
	for spec, want := range map[string][]string{
		"none": {"none"},
		"fp16": {"none", "fp16"},
		"bf16": {"none", "bf16"},
		"dyn8": {"none", "bf16", "dyn8:block=2048"},
		"int8": {"none", "bf16", "int8:block=2048"},
	} {
		got, err := Ladder(spec)
		if err != nil {
			t.Fatalf("Ladder(%q): %v", spec, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Ladder(%q) = %q, want %q", spec, got, want)
		}
	}
	if _, err := Ladder("topk:ratio=0.01"); err == nil {
		t.Error("Ladder(topk) accepted a codec activations cannot take")
	}
	// With several codecs the bound is the largest encoding (none's) and
	// the byte naming the codec.
	none, err := MaxPayload("none", 100)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := LadderPayload([]string{"none", "bf16", "dyn8"}, 100); err != nil || got != none+1 {
		t.Errorf("LadderPayload = %d, %v; want %d", got, err, none+1)
	}
	if got, err := LadderPayload([]string{"none"}, 100); err != nil || got != none {
		t.Errorf("LadderPayload of one codec = %d, %v; want %d", got, err, none)
	}
}

func TestPickCodec(t *testing.T) {
	// At 1 MB/s none's message takes 3 ms more than the most compressed
	// codec's, bf16's 1 ms more.
	sizes := []int{4000, 2000, 1000}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for _, tc := range []struct {
		rate    float64
		compute time.Duration
		cur     int
		want    int
		why     string
	}{
		{1e6, ms(100), 2, 0, "none's extra 3 ms fits in 0.8 of 5 % of 100 ms"},
		{1e6, ms(70), 2, 1, "none's extra 3 ms is above 0.8 of 5 % of 70 ms (2.8 ms): moving up needs the margin, bf16's 1 ms has it"},
		{1e6, ms(70), 0, 0, "a link that carries none keeps it while its extra 3 ms fits in 5 % of 70 ms"},
		{1e6, ms(50), 0, 1, "none's extra 3 ms no longer fits in 2.5 ms"},
		{1e6, ms(10), 0, 2, "nothing fits in 0.5 ms: the most compressed"},
		{1e6, 0, 2, 2, "no compute measured yet: the most compressed"},
		{0, ms(500), 0, 2, "an unmeasured link: the most compressed"},
		{math.NaN(), ms(500), 0, 2, "not a rate"},
		{math.Inf(1), 0, 2, 0, "an infinitely fast link takes none at once"},
	} {
		if got := pickCodec(sizes, tc.rate, tc.compute, tc.cur); got != tc.want {
			t.Errorf("pickCodec(rate %g, compute %v, cur %d) = %d, want %d: %s", tc.rate, tc.compute, tc.cur, got, tc.want, tc.why)
		}
	}
}

// TestLinkCodecsFollowRates runs the tiny gpt in 3 stages with per-link
// codecs: on links too fast to measure the step is bit for bit the one
// with none, on unmeasured links the one with dyn8, each message one byte
// longer for the codec it names.
func TestLinkCodecsFollowRates(t *testing.T) {
	p := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 8)
	split := Split{0, 2, 4, 5}
	for _, tc := range []struct {
		rate  float64
		codec string
	}{{math.Inf(1), "none"}, {0, "dyn8"}} {
		want := runPipeline(t, p, split, 4, OneFOneB, tc.codec)
		got := runPipelineConfig(t, p, split, Config{Micro: 4, Schedule: OneFOneB, Codec: "dyn8", LinkCodecs: true, Rates: rates(tc.rate)})
		if got.loss != want.loss {
			t.Errorf("rate %g: loss %+v, want %s's %+v", tc.rate, got.loss, tc.codec, want.loss)
		}
		for _, name := range slices.Sorted(maps.Keys(want.grads)) {
			if !slices.Equal(got.grads[name], want.grads[name]) {
				t.Errorf("rate %g: gradient of %s differs from %s's", tc.rate, name, tc.codec)
			}
		}
		for s := range split.Stages() {
			w, g := want.results[s], got.results[s]
			msgs := int64(4) // a message a micro-batch each way on each of the stage's links
			if s > 0 && s < split.Stages()-1 {
				msgs *= 2
			}
			sent, recvd := w.Sent+msgs, w.Received+msgs
			if g.Sent != sent || g.Received != recvd {
				t.Errorf("rate %g, stage %d: sent %d and received %d bytes, want %d and %d (%s's and a byte a message)", tc.rate, s, g.Sent, g.Received, sent, recvd, tc.codec)
			}
		}
	}
}

// TestLinkCodecsAdapt checks that a stage moves a fast link to an exact
// codec once it has measured its compute: the first step, with nothing
// measured, sends the configured codec, the second none.
func TestLinkCodecsAdapt(t *testing.T) {
	p := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 8)
	split := Split{0, 2, 5}
	net := NewMemNetwork(2)
	stages := newStages(t, p.name, p.cfg, p.whole, split, net, Config{Micro: 4, Codec: "int8", LinkCodecs: true, Rates: rates(1e15)})
	want := [][2]string{{"int8:block=2048", "int8:block=2048"}, {"none", "none"}}
	for step := range 2 {
		stepAll(t, stages, p, uint64(step))
		act, _ := stages[0].LinkCodecs()
		_, grad := stages[1].LinkCodecs()
		if act != want[step][0] || grad != want[step][1] {
			t.Errorf("step %d sent activations with %q and their gradients with %q, want %q", step, act, grad, want[step])
		}
	}
	if a, _ := stages[1].LinkCodecs(); a != "" {
		t.Errorf("the last stage names an activation codec %q", a)
	}
	if _, g := stages[0].LinkCodecs(); g != "" {
		t.Errorf("the first stage names a gradient codec %q", g)
	}
}

// rates returns a Config.Rates whose links both read r bytes/s.
func rates(r float64) func() (float64, float64) { return func() (float64, float64) { return r, r } }

// stepAll runs one step of p's batch on every stage of a pipeline.
func stepAll(t *testing.T, stages []*Stage, p *problem, step uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a deadlock, not a wait
	defer cancel()
	errs := make([]error, len(stages))
	var wg sync.WaitGroup
	for s, st := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, errs[s] = st.Step(ctx, step, p.n, p.batch, 0, nil); errs[s] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestLinkCodecsRefuseUnknownCodec checks that a message naming a codec
// its link does not carry fails the step with ErrBadCodec.
func TestLinkCodecsRefuseUnknownCodec(t *testing.T) {
	p := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 8)
	net := NewMemNetwork(2)
	stages := newStages(t, p.name, p.cfg, p.whole, Split{0, 2, 5}, net, Config{Micro: 4, Codec: "dyn8", LinkCodecs: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := net.Stage(0).Send(ctx, Key{Step: 1, Micro: 0, Kind: Activation}, []byte{3, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	_, err := stages[1].Step(ctx, 1, p.n, p.batch, 0, nil)
	if !errors.Is(err, ErrBadCodec) {
		t.Fatalf("a message naming codec 3 of 3: %v, want ErrBadCodec", err)
	}
}
