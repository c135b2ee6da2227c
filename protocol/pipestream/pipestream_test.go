package pipestream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/internal/p2ptest"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/protocol/directlink"
	"github.com/p2ptrain/p2ptrain/protocol/ringstream"
)

// cluster is n connected loopback hosts, each with a Service.
type cluster struct {
	hosts []host.Host
	svcs  []*Service
	ids   []string
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{}
	for i := range n {
		h := p2ptest.Host(t)
		p2ptest.Connect(t, h, c.hosts...)
		s := New(h, nil, zaptest.NewLogger(t).Named(string(rune('a'+i))))
		t.Cleanup(s.Close)
		c.hosts, c.svcs, c.ids = append(c.hosts, h), append(c.svcs, s), append(c.ids, h.ID().String())
	}
	return c
}

// pipe is stage s's Pipe of a pipeline over all of c's hosts.
func (c *cluster) pipe(s int) Pipe {
	return Pipe{Epoch: 5, Digest: "d1g3st", Peers: c.ids, Self: c.ids[s], Micro: 4, Codec: "none",
		MaxPayload: 1 << 16, TiedBytes: 64, EvalChunks: 6, Step: 10, Timeout: 20 * time.Second}
}

func (c *cluster) open(t *testing.T, s int, p Pipe) *Transport {
	t.Helper()
	tr, err := c.svcs[s].Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Reset(nil) })
	return tr
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound on a deadlock, not a wait
	t.Cleanup(cancel)
	return ctx
}

// TestPipelineStepOverLibp2pMatchesMemory: a gpt cut in 3 stages on 3
// hosts runs one step (4 micro-batches, 1F1B, dyn8 activations), the
// tied table's exchange and then an evaluation (110 held-out samples: 10
// chunks in 3 rounds) over the protocol, and every stage's gradient, loss,
// byte count and held-out figures are bit-identical to the same over a
// MemNetwork; so with the frames over direct links (every service opened
// some) and over the streams (none).
func TestPipelineStepOverLibp2pMatchesMemory(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(map[bool]string{true: "direct links", false: "streams"}[direct], func(t *testing.T) {
			pipelineStepMatchesMemory(t, direct)
		})
	}
}

func pipelineStepMatchesMemory(t *testing.T, direct bool) {
	const S, M, n, held = 3, 4, 12, 110
	cfg := model.Config{MaxBatch: n, GPT: model.GPTConfig{Layers: 2, DModel: 16, Heads: 2, Context: 8, Vocab: 32}}
	infos, err := model.Layers("gpt", cfg)
	if err != nil {
		t.Fatal(err)
	}
	costs := make([]float64, len(infos))
	for i, l := range infos {
		costs[i] = float64(l.Params + l.TiedParams)
	}
	split, _, err := pipeline.Balance(costs, S)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := model.New("gpt", cfg, []gpu.Device{gpu.NewCPU(0)}, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	batch := whole.RandomBatch(n, 4)
	ds := model.BatchSamples{B: whole.RandomBatch(held, 5), N: held}
	c := newCluster(t, S)
	for _, svc := range c.svcs {
		svc.SetDirect(direct)
	}
	type result struct {
		res   pipeline.Result
		grads []float32
		eval  model.Stats
	}
	run := func(transport func(s int) pipeline.Transport) []result {
		out := make([]result, S)
		errs := make([]error, S)
		var wg sync.WaitGroup
		for s := range S {
			m, err := model.NewStage("gpt", cfg, gpu.NewCPU(s), 3, split[s], split[s+1])
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			st, err := pipeline.NewStage(m, transport(s), pipeline.Config{Stages: S, Stage: s, Micro: M, Codec: "dyn8", Seed: uint64(s)})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if out[s].res, errs[s] = st.Step(testCtx(t), 10, n, batch, 0, nil); errs[s] != nil {
					return
				}
				if err := st.SumTied(testCtx(t), 10); err != nil && !errors.Is(err, pipeline.ErrNoTie) {
					errs[s] = err
					return
				}
				out[s].grads = slices.Clone(m.Grads())
				out[s].eval, errs[s] = st.Evaluate(testCtx(t), 11, ds)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return out
	}
	mem := pipeline.NewMemNetwork(S)
	want := run(mem.Stage)
	trs := make([]*Transport, S)
	for s := range S {
		p := c.pipe(s)
		p.Codec, p.Micro = "dyn8", M
		p.TiedBytes = 4 * cfg.GPT.Vocab * cfg.GPT.DModel // the token table, fp32
		p.EvalChunks = pipeline.EvalChunks(held, n)
		trs[s] = c.open(t, s, p)
	}
	got := run(func(s int) pipeline.Transport { return trs[s] })
	for s := range S {
		if got[s].res != want[s].res {
			t.Errorf("stage %d: result %+v over libp2p, %+v in memory", s, got[s].res, want[s].res)
		}
		if got[s].eval != want[S-1].eval || want[s].eval != want[S-1].eval {
			t.Errorf("stage %d: held-out figures %+v over libp2p, %+v in memory, the last stage's %+v", s, got[s].eval, want[s].eval, want[S-1].eval)
		}
		if !slices.Equal(got[s].grads, want[s].grads) {
			t.Errorf("stage %d: gradients differ between libp2p and memory", s)
		}
		if trs[s].Sent() == 0 && s < S-1 {
			t.Errorf("stage %d sent nothing", s)
		}
	}
	for s, svc := range c.svcs {
		if n := svc.DirectLinks(); (n > 0) != direct {
			t.Errorf("stage %d opened %d direct links (direct links on: %v)", s, n, direct)
		}
	}
	if want[S-1].res.Stats.Samples == 0 || want[S-1].eval.Samples != held*cfg.GPT.Context {
		t.Fatalf("the last stage counted %d labels in the step and %d held out", want[S-1].res.Stats.Samples, want[S-1].eval.Samples)
	}
	for s := range S {
		if err := trs[s].Close(); err != nil {
			t.Errorf("closing stage %d: %v", s, err)
		}
	}
}

// rawStream opens a stream from host a to b's service and writes the hello
// of epoch 5 and mode 0 (the frames follow on the stream): the test then
// writes frames of its own making.
func rawStream(t *testing.T, c *cluster, a, b int, digest string) network.Stream {
	t.Helper()
	st, err := c.hosts[a].NewStream(testCtx(t), c.hosts[b].ID(), ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(append(ringstream.AppendHello(nil, 5, digest), 0)); err != nil {
		t.Fatal(err)
	}
	return st
}

// caseTransport opens stage 1's transport of c under a digest of its own
// (prefix and case i), so that only that case's streams reach it.
func caseTransport(t *testing.T, c *cluster, prefix string, i int) (*Transport, string) {
	t.Helper()
	p := c.pipe(1)
	p.Digest = prefix + string(rune('a'+i))
	return c.open(t, 1, p), p.Digest
}

// recvFailsNaming checks that tr's wait for stage 0's activation of step
// 10, micro-batch 1, fails with a *PeerError naming peer and wrapping want.
func recvFailsNaming(t *testing.T, tr *Transport, peer string, want error) {
	t.Helper()
	_, err := tr.Recv(testCtx(t), pipeline.Key{Step: 10, Micro: 1, Kind: pipeline.Activation})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != peer || !errors.Is(err, want) {
		t.Fatalf("Recv after a bad frame or record: %v; want a *PeerError naming %s wrapping %v", err, peer, want)
	}
}

// header is a valid activation frame header from stage 0 to stage 1 of
// the test pipeline, for the bad-frame cases to spoil.
func header(kind pipeline.Kind, codec uint32, step uint64, micro, n uint32) []byte {
	return appendFrame(nil, pipeline.Key{Step: step, Micro: int(micro), Kind: kind}, codec, 5, make([]byte, n))[:HeaderLen]
}

// TestBadFramesFailNamingThePeer: every malformed or out-of-place frame
// fails the receiving transport with a *PeerError naming the sender and
// the right sentinel, without a panic and without allocating a payload
// beyond the pipeline's bound (a 4 GiB length is refused from the header).
func TestBadFramesFailNamingThePeer(t *testing.T) {
	none := CodecID("none")
	setLen := func(h []byte, n uint32) []byte { binary.LittleEndian.PutUint32(h[28:], n); return h }
	eval := func(micro, n uint32) []byte { return header(pipeline.EvalStats, 0, 10, micro, n) }
	cases := []struct {
		name  string
		from  int // the sending stage: 0 but for frames that stage 2 sends back
		frame func() []byte
		want  error
	}{
		{"version", 0, func() []byte { h := header(pipeline.Activation, none, 10, 0, 8); h[0] = 9; return h }, allreduce.ErrBadFrame},
		{"reserved", 0, func() []byte { h := header(pipeline.Activation, none, 10, 0, 8); h[3] = 1; return h }, allreduce.ErrBadFrame},
		{"epoch", 0, func() []byte {
			h := header(pipeline.Activation, none, 10, 0, 8)
			binary.LittleEndian.PutUint64(h[8:], 6)
			return h
		}, allreduce.ErrEpochMismatch},
		{"codec", 0, func() []byte { return header(pipeline.Activation, CodecID("dyn8"), 10, 0, 8) }, allreduce.ErrCodecMismatch},
		{"kind from the wrong stage", 0, func() []byte { return header(pipeline.Gradient, none, 10, 0, 8) }, allreduce.ErrBadFrame},
		{"unknown kind", 0, func() []byte { return header(pipeline.Kind(77), none, 10, 0, 8) }, allreduce.ErrBadFrame},
		{"micro-batch", 0, func() []byte { return header(pipeline.Activation, none, 10, 4, 8) }, allreduce.ErrBadFrame},
		{"huge length", 0, func() []byte { return setLen(header(pipeline.Activation, none, 10, 0, 0), 1<<32-1) }, allreduce.ErrFrameTooLarge},
		{"stale step", 0, func() []byte { return header(pipeline.Activation, none, 9, 0, 8) }, allreduce.ErrBadFrame},
		{"step ahead", 0, func() []byte { return header(pipeline.Activation, none, 12, 0, 8) }, allreduce.ErrBadFrame},
		{"duplicate", 0, func() []byte {
			f := appendFrame(nil, pipeline.Key{Step: 10, Kind: pipeline.Activation}, none, 5, make([]byte, 8))
			return append(f, f...)
		}, allreduce.ErrBadFrame},
		// An evaluation's frames: chunks below EvalChunks (6), rounds below
		// its rounds (2 of Micro 4), figures of exactly EvalStatsBytes.
		{"eval chunk", 0, func() []byte { return header(pipeline.EvalActivation, none, 10, 6, 8) }, allreduce.ErrBadFrame},
		{"eval codec", 0, func() []byte { return header(pipeline.EvalActivation, 0, 10, 0, 8) }, allreduce.ErrCodecMismatch},
		{"eval length", 0, func() []byte { return setLen(header(pipeline.EvalActivation, none, 10, 5, 0), 1<<16+1) }, allreduce.ErrFrameTooLarge},
		{"eval stats from the wrong stage", 0, func() []byte { return eval(0, pipeline.EvalStatsBytes) }, allreduce.ErrBadFrame},
		{"eval stats round", 2, func() []byte { return eval(2, pipeline.EvalStatsBytes) }, allreduce.ErrBadFrame},
		{"eval stats short", 2, func() []byte { return eval(1, pipeline.EvalStatsBytes-1) }, allreduce.ErrFrameTooLarge},
		{"eval stats long", 2, func() []byte { return eval(1, pipeline.EvalStatsBytes+1) }, allreduce.ErrFrameTooLarge},
		{"eval stats codec", 2, func() []byte { return header(pipeline.EvalStats, none, 10, 1, pipeline.EvalStatsBytes) }, allreduce.ErrCodecMismatch},
		{"eval stats stale step", 2, func() []byte { return header(pipeline.EvalStats, 0, 9, 0, pipeline.EvalStatsBytes) }, allreduce.ErrBadFrame},
		{"loss frame names a micro-batch", 2, func() []byte { return header(pipeline.Loss, 0, 10, 1, pipeline.LossBytes) }, allreduce.ErrBadFrame},
	}
	c := newCluster(t, 3)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, digest := caseTransport(t, c, "case", i)
			st := rawStream(t, c, tc.from, 1, digest)
			defer st.Reset()
			if _, err := st.Write(tc.frame()); err != nil {
				t.Fatal(err)
			}
			recvFailsNaming(t, tr, c.ids[tc.from], tc.want)
			// The transport stays failed.
			if _, err := tr.Recv(testCtx(t), pipeline.Key{Step: 10, Kind: pipeline.Gradient}); err == nil {
				t.Fatal("a failed transport received again")
			}
		})
	}
}

// TestBadRecordsOverADirectLinkFailNamingThePeer: over a direct link a
// frame is one record, opened before its header can be read: a record
// above the largest frame is refused before allocation, and a record too
// short for a header, a header whose length disagrees with the record, or
// a bad header, fail the receiving transport with a *PeerError naming the
// sender.
func TestBadRecordsOverADirectLinkFailNamingThePeer(t *testing.T) {
	none := CodecID("none")
	frame := func(n int) []byte {
		return appendFrame(nil, pipeline.Key{Step: 10, Kind: pipeline.Activation}, none, 5, make([]byte, n))
	}
	cases := []struct {
		name   string
		record []byte
		want   error
	}{
		{"above the largest frame", make([]byte, HeaderLen+1<<16+1), allreduce.ErrFrameTooLarge},
		{"shorter than a header", make([]byte, HeaderLen-1), allreduce.ErrBadFrame},
		{"length above the record", frame(8)[:HeaderLen+7], allreduce.ErrBadFrame},
		{"length below the record", append(frame(8), 0), allreduce.ErrBadFrame},
		{"bad header", func() []byte { f := frame(8); f[3] = 1; return f }(), allreduce.ErrBadFrame},
	}
	c := newCluster(t, 2)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, digest := caseTransport(t, c, "rec", i)
			ctx := testCtx(t)
			st, err := c.hosts[0].NewStream(ctx, c.hosts[1].ID(), ID)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Reset()
			link, err := directlink.NewBroker(nil).Open(ctx, c.hosts[1].ID(), st, ringstream.AppendHello(nil, 5, digest))
			if err != nil || link == nil {
				t.Fatalf("no direct link to stage 1: %v", err)
			}
			defer link.Close()
			if err := link.WriteFrame(tc.record); err != nil {
				t.Fatal(err)
			}
			recvFailsNaming(t, tr, c.ids[0], tc.want)
		})
	}
}

// TestFramesBeforeOpenAndEarlyStepAreDelivered: a stage that sends before
// its neighbour opened the epoch's transport is delivered once it opens,
// and a frame one step ahead waits for its Recv.
func TestFramesBeforeOpenAndEarlyStepAreDelivered(t *testing.T) {
	c := newCluster(t, 2)
	a := c.open(t, 0, c.pipe(0))
	ctx := testCtx(t)
	act := []byte("activation of step 10")
	next := []byte("activation of step 11")
	if err := a.Send(ctx, pipeline.Key{Step: 10, Micro: 2, Kind: pipeline.Activation}, act); err != nil {
		t.Fatal(err)
	}
	if err := a.Send(ctx, pipeline.Key{Step: 11, Micro: 0, Kind: pipeline.Activation}, next); err != nil {
		t.Fatal(err)
	}
	b := c.open(t, 1, c.pipe(1))
	if got, err := b.Recv(ctx, pipeline.Key{Step: 10, Micro: 2, Kind: pipeline.Activation}); err != nil || !bytes.Equal(got, act) {
		t.Fatalf("Recv %q, %v", got, err)
	}
	if err := b.Send(ctx, pipeline.Key{Step: 10, Micro: 2, Kind: pipeline.Gradient}, []byte("g")); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, pipeline.Key{Step: 10, Kind: pipeline.Loss}, make([]byte, pipeline.LossBytes)); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Recv(ctx, pipeline.Key{Step: 10, Micro: 2, Kind: pipeline.Gradient}); err != nil || string(got) != "g" {
		t.Fatalf("Recv %q, %v", got, err)
	}
	if _, err := a.Recv(ctx, pipeline.Key{Step: 10, Kind: pipeline.Loss}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Recv(ctx, pipeline.Key{Step: 11, Micro: 0, Kind: pipeline.Activation}); err != nil || !bytes.Equal(got, next) {
		t.Fatalf("Recv %q, %v", got, err)
	}
	// Sends the pipeline's bounds forbid are refused before any IO.
	if err := a.Send(ctx, pipeline.Key{Step: 11, Micro: 4, Kind: pipeline.Activation}, nil); err == nil {
		t.Error("a micro-batch beyond train.micro_batches was sent")
	}
	if err := a.Send(ctx, pipeline.Key{Step: 11, Micro: 6, Kind: pipeline.EvalActivation}, nil); err == nil {
		t.Error("a chunk beyond the held-out set's was sent")
	}
	if err := a.Send(ctx, pipeline.Key{Step: 11, Micro: 1, Kind: pipeline.Commit}, make([]byte, pipeline.CommitBytes)); err == nil {
		t.Error("a commit naming a micro-batch was sent")
	}
	if err := a.Send(ctx, pipeline.Key{Step: 11, Kind: pipeline.Activation}, make([]byte, 1<<16+1)); err == nil {
		t.Error("a payload beyond MaxPayload was sent")
	}
	if err := a.Send(ctx, pipeline.Key{Step: 11, Kind: pipeline.Gradient}, nil); err == nil {
		t.Error("the first stage sent a gradient")
	}
}

// TestSilentPeerTimesOut: a Recv whose sender never sends fails after
// Pipe.Timeout with ErrTimeout naming it.
func TestSilentPeerTimesOut(t *testing.T) {
	c := newCluster(t, 2)
	p := c.pipe(1)
	p.Timeout = 300 * time.Millisecond
	b := c.open(t, 1, p)
	start := time.Now()
	_, err := b.Recv(testCtx(t), pipeline.Key{Step: 10, Kind: pipeline.Activation})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != c.ids[0] || !errors.Is(err, allreduce.ErrTimeout) {
		t.Fatalf("Recv from a silent stage: %v; want ErrTimeout naming %s", err, c.ids[0])
	}
	if d := time.Since(start); d < p.Timeout {
		t.Fatalf("timed out after %s, before the %s deadline", d, p.Timeout)
	}
}

// TestDeadOrResetPeerFailsPromptly: a stage whose neighbour resets its
// transport (a failed step), or whose neighbour's host dies, fails its
// Recv at once with a *PeerError naming the neighbour, long before the
// deadline: ErrAborted for a reset (the neighbour's step failed: it is
// not to blame), ErrPeerFailed or ErrAborted for a host that died (a
// closing host resets its streams too); over direct links and over the
// streams.
func TestDeadOrResetPeerFailsPromptly(t *testing.T) {
	for _, tc := range []struct {
		how    string
		direct bool
	}{{"reset", true}, {"reset", false}, {"killed", true}, {"killed", false}, {"killed before sending", true}} {
		how := tc.how
		t.Run(fmt.Sprintf("%s, direct links %v", how, tc.direct), func(t *testing.T) {
			c := newCluster(t, 2)
			for _, svc := range c.svcs {
				svc.SetDirect(tc.direct)
			}
			a, b := c.open(t, 0, c.pipe(0)), c.open(t, 1, c.pipe(1))
			ctx := testCtx(t)
			if how != "killed before sending" {
				if err := a.Send(ctx, pipeline.Key{Step: 10, Kind: pipeline.Activation}, []byte("x")); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Recv(ctx, pipeline.Key{Step: 10, Kind: pipeline.Activation}); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			if how == "reset" {
				a.Reset(errors.New("step failed"))
			} else {
				c.svcs[0].Close()
				c.hosts[0].Close()
			}
			_, err := b.Recv(ctx, pipeline.Key{Step: 10, Micro: 1, Kind: pipeline.Activation})
			var pe *PeerError
			want := errors.Is(err, allreduce.ErrAborted) || (how != "reset" && errors.Is(err, allreduce.ErrPeerFailed))
			if !errors.As(err, &pe) || pe.Peer != c.ids[0] || !want {
				t.Fatalf("Recv from a %s stage: %v; want a *PeerError naming %s", how, err, c.ids[0])
			}
			t.Logf("%s: %v", how, err)
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the failure took %s to show", d)
			}
			if err := b.Send(ctx, pipeline.Key{Step: 10, Kind: pipeline.Gradient}, []byte("g")); err == nil && how == "reset" {
				// the write may land in the buffer of a stream the other side
				// reset; the next Recv from that side fails anyway
				t.Log("send to a reset stage succeeded (buffered)")
			}
		})
	}
}

// TestSenderSeesAReceiverResetAsAbort: when the receiving stage resets its
// transport (its step failed), the sending stage's Send fails with a
// *PeerError naming it as aborted (not to blame), over direct links (where
// the link's failure and the stream's reset travel on two connections) and
// over the streams.
func TestSenderSeesAReceiverResetAsAbort(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct links %v", direct), func(t *testing.T) {
			c := newCluster(t, 2)
			for _, svc := range c.svcs {
				svc.SetDirect(direct)
			}
			a, b := c.open(t, 0, c.pipe(0)), c.open(t, 1, c.pipe(1))
			ctx := testCtx(t)
			k := pipeline.Key{Step: 10, Kind: pipeline.Activation}
			if err := a.Send(ctx, k, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Recv(ctx, k); err != nil {
				t.Fatal(err)
			}
			b.Reset(errors.New("step failed"))
			// Sends may land in buffers for a while; one fails soon.
			payload := make([]byte, 1<<16)
			var err error
			for i := 0; err == nil && ctx.Err() == nil; i++ {
				err = a.Send(ctx, pipeline.Key{Step: 10 + uint64(i/4), Micro: i % 4, Kind: pipeline.Activation}, payload)
			}
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Peer != c.ids[1] || !errors.Is(err, allreduce.ErrAborted) {
				t.Fatalf("Send to a stage that reset: %v; want a *PeerError naming %s wrapping ErrAborted", err, c.ids[1])
			}
		})
	}
}

// TestOpenRefusesBadPipes: Open names what is wrong with a Pipe.
func TestOpenRefusesBadPipes(t *testing.T) {
	c := newCluster(t, 1)
	for _, tc := range []struct {
		edit func(*Pipe)
		want string
	}{
		{func(p *Pipe) { p.Self = "nobody" }, "not in pipeline"},
		{func(p *Pipe) { p.Micro = 0 }, "micro-batches"},
		{func(p *Pipe) { p.Digest = strings.Repeat("x", 65) }, "digest"},
		{func(p *Pipe) { p.Peers = []string{p.Self, p.Self} }, "repeated"},
	} {
		p := c.pipe(0)
		tc.edit(&p)
		if _, err := c.svcs[0].Open(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v): %v, want an error about %s", p, err, tc.want)
		}
	}
}
