package allreduce_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
)

func peerIDs(w int) []allreduce.PeerID {
	ps := make([]allreduce.PeerID, w)
	for i := range ps {
		ps[i] = allreduce.PeerID(fmt.Sprintf("peer-%d", i))
	}
	return ps
}

func randData(seed uint64, w, n int) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	d := make([][]float32, w)
	for i := range d {
		d[i] = make([]float32, n)
		for j := range d[i] {
			d[i][j] = float32(r.NormFloat64())
		}
	}
	return d
}

func average(data [][]float32) []float32 {
	n := len(data[0])
	avg := make([]float32, n)
	for j := 0; j < n; j++ {
		var s float64
		for i := range data {
			s += float64(data[i][j])
		}
		avg[j] = float32(s / float64(len(data)))
	}
	return avg
}

// cluster is W sessions on one memtransport network.
type cluster struct {
	net      *memtransport.Network
	peers    []allreduce.PeerID
	sessions []*allreduce.Session
}

func newCluster(t testing.TB, w int, epoch uint64, cfg allreduce.Config, opts memtransport.Options) *cluster {
	t.Helper()
	c := &cluster{net: memtransport.New(opts), peers: peerIDs(w)}
	for i := 0; i < w; i++ {
		s, err := allreduce.NewSession(allreduce.Ring{Number: epoch, Peers: c.peers, Self: c.peers[i]}, c.net.Endpoint(c.peers[i]), cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.sessions = append(c.sessions, s)
	}
	return c
}

func (c *cluster) close() {
	for _, s := range c.sessions {
		s.Close()
	}
}

// round runs one step on every peer with bucket sizes sizes; codecs[i][b]
// is peer i's codec of bucket b. It returns outputs [peer][bucket] and errors.
func (c *cluster) round(step uint64, data [][][]float32, codecs [][]compress.Codec) ([][][]float32, []error) {
	w := len(c.sessions)
	outs := make([][][]float32, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		outs[i] = make([][]float32, len(data[i]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.sessions[i].NewRound(context.Background(), step)
			for b := len(data[i]) - 1; b >= 0; b-- { // backward order
				outs[i][b] = make([]float32, len(data[i][b]))
				for k := range outs[i][b] {
					outs[i][b][k] = float32(math.NaN()) // must be overwritten on success
				}
				_ = r.Add(allreduce.Bucket{ID: uint32(b), Codec: codecs[i][b], Data: data[i][b], Out: outs[i][b]})
			}
			errs[i] = r.Wait()
		}()
	}
	wg.Wait()
	return outs, errs
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

type codecCase struct {
	name  string
	make  func(n int) compress.Codec
	bound func(avg []float32, data [][]float32) float64 // max abs error allowed
	cfg   allreduce.Config
}

func absMax(data [][]float32) float64 {
	m := 0.0
	for _, d := range data {
		for _, v := range d {
			m = math.Max(m, math.Abs(float64(v)))
		}
	}
	return m
}

func fakeCases() []codecCase {
	exact := func([]float32, [][]float32) float64 { return 1e-5 }
	q := func(_ []float32, d [][]float32) float64 { return float64(len(d)+1) * absMax(d) * float64(len(d)) / 127 }
	return []codecCase{
		{"fp32-ring", func(int) compress.Codec { return fakeFP32{} }, exact, allreduce.Config{}},
		{"fp32-direct", func(int) compress.Codec { return fakeFP32{} }, exact, allreduce.Config{Schedule: allreduce.ScheduleDirect}},
		{"q8-direct", func(int) compress.Codec { return fakeQ8{} }, q, allreduce.Config{}},
		{"q8-ring", func(int) compress.Codec { return fakeQ8{} }, q, allreduce.Config{Schedule: allreduce.ScheduleRing}},
		{"s8-ring", func(int) compress.Codec { return fakeS8{bucket: 8} }, q, allreduce.Config{}},
		{"s8-direct", func(int) compress.Codec { return fakeS8{bucket: 8} }, q, allreduce.Config{Schedule: allreduce.ScheduleDirect}},
		{"lowrank", func(n int) compress.Codec { return &fakeLowRank{n: n} }, exact, allreduce.Config{}},
		{"lowrank-direct", func(n int) compress.Codec { return &fakeLowRank{n: n} }, exact, allreduce.Config{Schedule: allreduce.ScheduleDirect}},
		// EF / sparse outputs are checked for identity only (their error is carried to later steps).
		{"sign-direct", func(n int) compress.Codec { return newFakeSign(n) }, nil, allreduce.Config{}},
		{"sign-allgather", func(n int) compress.Codec { return newFakeSign(n) }, nil, allreduce.Config{Schedule: allreduce.ScheduleAllGather}},
		{"topk", func(n int) compress.Codec { return newFakeTopK(n, 0.25) }, nil, allreduce.Config{}},
		{"topk-full", func(n int) compress.Codec { return newFakeTopK(n, 1) }, exact, allreduce.Config{}},
	}
}

// checkRound runs one step with two buckets of sizes n and n/2+3 and checks
// bit-identity across peers and the codec bound against the fp32 average.
func checkRound(t *testing.T, cc codecCase, w, n int, chunkBytes int) {
	t.Helper()
	cfg := cc.cfg
	cfg.ChunkBytes = chunkBytes
	c := newCluster(t, w, 1, cfg, memOpts())
	defer c.close()
	sizes := []int{n, n/2 + 3}
	data := make([][][]float32, w)
	codecs := make([][]compress.Codec, w)
	for b, sz := range sizes {
		d := randData(uint64(100*w+n+b), w, sz)
		for i := 0; i < w; i++ {
			data[i] = append(data[i], d[i])
			codecs[i] = append(codecs[i], cc.make(sz))
		}
	}
	outs, errs := c.round(3, data, codecs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s W=%d n=%d: peer %d: %v", cc.name, w, n, i, err)
		}
	}
	for b := range sizes {
		for i := 1; i < w; i++ {
			if !bitsEqual(outs[0][b], outs[i][b]) {
				t.Fatalf("%s W=%d n=%d bucket %d: peer %d differs from peer 0", cc.name, w, n, b, i)
			}
		}
		if cc.bound == nil {
			continue
		}
		col := make([][]float32, w)
		for i := range col {
			col[i] = data[i][b]
		}
		avg := average(col)
		tol := cc.bound(avg, col)
		for k := range avg {
			if d := math.Abs(float64(outs[0][b][k] - avg[k])); !(d <= tol) {
				t.Fatalf("%s W=%d n=%d bucket %d: out[%d]=%v, avg %v, err %g > %g", cc.name, w, n, b, k, outs[0][b][k], avg[k], d, tol)
			}
		}
	}
}

// TestAllReduceFakeCodecs covers every class and schedule for W = 1…8 and
// odd sizes (0, 1, < W, not a multiple of chunks), with tiny chunks so that
// the pipeline has many chunks.
func TestAllReduceFakeCodecs(t *testing.T) {
	for _, cc := range fakeCases() {
		t.Run(cc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for w := 1; w <= 8; w++ {
					for _, n := range []int{0, 1, w - 1, 37, 1001} {
						checkRound(t, cc, w, n, 64)
					}
				}
			})
		})
	}
}

// TestProportionalShares runs the proportional schedule with a zero share.
func TestProportionalShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cc := codecCase{"fp32-prop", func(int) compress.Codec { return fakeFP32{} },
			func([]float32, [][]float32) float64 { return 1e-5 },
			allreduce.Config{Schedule: allreduce.ScheduleProportional, Shares: []float64{0, 0.5, 0.25, 0.25}}}
		checkRound(t, cc, 4, 1001, 64)
		cc.make = func(int) compress.Codec { return fakeS8{bucket: 8} }
		cc.bound = func(_ []float32, d [][]float32) float64 { return 5 * absMax(d) * 4 / 127 }
		checkRound(t, cc, 4, 1001, 64)
	})
}

var _ = errors.Is
var _ = time.Second

func memOpts() memtransport.Options { return memtransport.Options{Capacity: 8} }

// TestRingOfOneReturnsTheGradient: in a ring of one the average is the
// gradient itself, bit for bit, whatever the codec (a quantizing codec would
// only add error, and nothing is sent).
func TestRingOfOneReturnsTheGradient(t *testing.T) {
	const n = 10_000
	for _, spec := range []string{"none", "sint8", "qsgd:bits=4", "onebit"} {
		c := newCluster(t, 1, 1, allreduce.Config{}, memOpts())
		cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		for step := range uint64(3) {
			data := randData(step+1, 1, n)
			outs, errs := c.round(step, [][][]float32{{data[0]}}, [][]compress.Codec{{cd}})
			if errs[0] != nil {
				t.Fatalf("%s step %d: %v", spec, step, errs[0])
			}
			if !bitsEqual(outs[0][0], data[0]) {
				t.Fatalf("%s step %d: a ring of one changed the gradient", spec, step)
			}
		}
		c.close()
	}
}
