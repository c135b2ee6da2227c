package allreduce_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
)

// recvIntoEndpoint is a memtransport endpoint that is also an
// allreduce.FrameReceiver, as ringstream's Transport is, so that sessions
// over it recycle the buffers of the frames they receive.
type recvIntoEndpoint struct{ *memtransport.Endpoint }

func (e recvIntoEndpoint) RecvInto(ctx context.Context, from allreduce.PeerID, alloc func(int) []byte) ([]byte, error) {
	b, err := e.Recv(ctx, from)
	if err != nil {
		return nil, err
	}
	buf := alloc(len(b))
	copy(buf, b)
	return buf, nil
}

// TestFrameRecyclingKeepsResults: with frame buffers recycled on both
// paths (encoded frames once sent, received ones once consumed) and every
// recycled buffer overwritten at once, every schedule and codec class gives
// the same bits, round after round, as sessions whose received frames are
// never recycled and nothing is overwritten. A frame recycled while still
// read would differ (or race with the overwrite under -race).
func TestFrameRecyclingKeepsResults(t *testing.T) {
	cases := []struct {
		spec  string
		sched allreduce.Schedule
	}{
		{"none", allreduce.ScheduleRing}, {"none", allreduce.ScheduleDirect}, {"none", allreduce.ScheduleProportional},
		{"int8", allreduce.ScheduleRing}, {"sint8", ""}, {"qsgd:bits=4", ""},
		{"onebit", ""}, {"onebit", allreduce.ScheduleAllGather}, {"topk:ratio=0.1", ""}, {"powersgd:rank=2", ""},
	}
	const w, n, rounds = 4, 5003, 4
	for _, k := range cases {
		t.Run(fmt.Sprintf("%s/%s", k.spec, k.sched), func(t *testing.T) {
			run := func(recycle bool) [][]float32 {
				defer allreduce.SetFramePoisoning(allreduce.SetFramePoisoning(recycle))
				var got [][]float32
				synctest.Test(t, func(t *testing.T) {
					got = recyclingRounds(t, k.spec, k.sched, recycle, w, n, rounds)
				})
				return got
			}
			want, got := run(false), run(true)
			for r := range want {
				if !bitsEqual(got[r], want[r]) {
					t.Fatalf("round %d: recycled frames changed the result", r)
				}
			}
		})
	}
}

// recyclingRounds runs rounds all-reduces of fresh data on w peers and
// returns peer 0's result of each (after checking every peer agrees);
// recvInto makes the endpoints FrameReceivers.
func recyclingRounds(t *testing.T, spec string, sched allreduce.Schedule, recvInto bool, w, n, rounds int) [][]float32 {
	net := memtransport.New(memOpts())
	peers := peerIDs(w)
	cfg := allreduce.Config{ChunkBytes: 4096, Schedule: sched}
	if sched == allreduce.ScheduleProportional {
		cfg.Shares = []float64{0.1, 0.2, 0.3, 0.4}
	}
	c := &cluster{net: net, peers: peers}
	defer c.close()
	codecs := make([][]compress.Codec, w)
	for i := range peers {
		var tr allreduce.Transport = net.Endpoint(peers[i])
		if recvInto {
			tr = recvIntoEndpoint{net.Endpoint(peers[i])}
		}
		s, err := allreduce.NewSession(allreduce.Ring{Number: 3, Peers: peers, Self: peers[i]}, tr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.sessions = append(c.sessions, s)
		cd, err := compress.New(spec, compress.Options{Layout: layoutFor(spec, n), Seed: uint64(i + 1), SharedSeed: 42})
		if err != nil {
			t.Fatal(err)
		}
		codecs[i] = []compress.Codec{cd}
	}
	var res [][]float32
	for step := range uint64(rounds) {
		d := randData(step+7, w, n)
		data := make([][][]float32, w)
		for i := range data {
			data[i] = [][]float32{d[i]}
		}
		outs, errs := c.round(step, data, codecs)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d: peer %d: %v", step, i, err)
			}
		}
		for i := 1; i < w; i++ {
			if !bitsEqual(outs[0][0], outs[i][0]) {
				t.Fatalf("step %d: peer %d differs from peer 0", step, i)
			}
		}
		res = append(res, outs[0][0])
	}
	return res
}

// TestCodecsIgnoreStaleBytes: every codec writes every byte of its encoding
// (and a shared-scale codec of its scaled encoding), so a recycled frame
// buffer with stale contents encodes exactly as a zeroed one.
func TestCodecsIgnoreStaleBytes(t *testing.T) {
	for _, spec := range compress.Specs() {
		for _, n := range []int{1000, 4099} {
			r := rand.New(rand.NewPCG(uint64(n), 2))
			src := make([]float32, n)
			for i := range src {
				src[i] = float32(r.NormFloat64())
			}
			encode := func(fill byte) []byte {
				cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: 1, SharedSeed: 2})
				if err != nil {
					t.Fatal(err)
				}
				buf := bytes.Repeat([]byte{fill}, allreduce.HeaderSize+cd.MaxEncodedLen(n)+64)[:allreduce.HeaderSize]
				if ss, ok := cd.(compress.SharedScaler); ok {
					scales := make([]float32, ss.NumScales(n))
					ss.Scales(scales, src)
					out, err := ss.EncodeScaled(buf, src, scales, 4, compress.Pos{Step: 1})
					if err != nil {
						t.Fatalf("%s: %v", spec, err)
					}
					return out
				}
				out, err := cd.Encode(buf, src, compress.Pos{Step: 1})
				if err != nil {
					t.Fatalf("%s: %v", spec, err)
				}
				return out
			}
			if a, b := encode(0), encode(0xA5); !bytes.Equal(a[allreduce.HeaderSize:], b[allreduce.HeaderSize:]) {
				t.Errorf("%s, %d values: the encoding depends on the stale bytes of dst", spec, n)
			}
		}
	}
}
