package node

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/config"
)

// keyedCluster starts n loopback peers sharing a swarm key and waits until they
// agree on a ring; it returns them in ring order with the allreduce epoch.
// configure (may be nil) edits every peer's configuration.
func keyedCluster(t *testing.T, n int, configure func(*config.Config)) ([]*Node, []allreduce.PeerID, uint64) {
	t.Helper()
	key := filepath.Join(t.TempDir(), "swarm.key")
	if err := WriteSwarmKey(key); err != nil {
		t.Fatal(err)
	}
	var nodes []*Node
	for i := 0; i < n; i++ {
		var bootstrap []string
		if i > 0 {
			bootstrap = nodes[0].AddrStrings()[:1]
		}
		cfg := testConfig(bootstrap...)
		cfg.Node.SwarmKey = key
		if configure != nil {
			configure(&cfg)
		}
		nodes = append(nodes, startNode(t, cfg, nil))
	}
	eventually(t, 15*time.Second, "peers agree", func() error { return agreeOn(nodes, ids(nodes)) })
	_, e := nodes[0].Gossip().Snapshot()
	var order []allreduce.PeerID
	byID := map[string]*Node{}
	for _, nd := range nodes {
		byID[nd.ID().String()] = nd
	}
	ordered := make([]*Node, 0, n)
	for _, p := range e.Order {
		order = append(order, allreduce.PeerID(p))
		ordered = append(ordered, byID[p])
	}
	return ordered, order, e.Number
}

func TestAllreduceOverLibp2p(t *testing.T) {
	const size = 300_001 // odd, several chunks per segment
	nodes, order, epoch := keyedCluster(t, 4, nil)
	for _, spec := range []string{"none", "sint8", "dyn8"} {
		t.Run(spec, func(t *testing.T) {
			outs, want := allreduceOnce(t, nodes, order, epoch, spec, size)
			var errNorm, norm float64
			for j := range want {
				for i := 1; i < len(nodes); i++ {
					if math.Float32bits(outs[i][j]) != math.Float32bits(outs[0][j]) {
						t.Fatalf("peer %d differs from peer 0 at %d: %v vs %v", i, j, outs[i][j], outs[0][j])
					}
				}
				d := float64(outs[0][j]) - want[j]
				errNorm += d * d
				norm += want[j] * want[j]
			}
			rel := math.Sqrt(errNorm / norm)
			if bound := map[string]float64{"none": 1e-6, "sint8": 0.2, "dyn8": 0.1}[spec]; rel > bound {
				t.Fatalf("relative error %.3g above %.3g", rel, bound)
			}
			t.Logf("%s: 4 peers bit-identical, relative error %.2e", spec, rel)
		})
		epoch++ // a fresh transport per run: use a new epoch number
	}
}

// allreduceOnce all-reduces size seeded normal values per peer with codec
// spec over the nodes' transports of epoch, failing the test on any error;
// it returns every peer's output and the exact mean.
func allreduceOnce(t *testing.T, nodes []*Node, order []allreduce.PeerID, epoch uint64, spec string, size int) ([][]float32, []float64) {
	t.Helper()
	inputs := make([][]float32, len(nodes))
	outs := make([][]float32, len(nodes))
	want := make([]float64, size)
	for i := range nodes {
		r := rand.New(rand.NewPCG(uint64(i), 7))
		inputs[i] = make([]float32, size)
		for j := range inputs[i] {
			inputs[i][j] = float32(r.NormFloat64())
			want[j] += float64(inputs[i][j]) / float64(len(nodes))
		}
		outs[i] = make([]float32, size)
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep := allreduce.Ring{Number: epoch, Peers: order, Self: order[i]}
			tr := nd.OpenTransport(ep)
			defer tr.Close()
			s, err := allreduce.NewSession(ep, tr, allreduce.Config{ChunkBytes: 64 << 10, Logger: zaptest.NewLogger(t)})
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			c, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(size), Seed: uint64(i)})
			if err != nil {
				errs[i] = err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = s.AllReduce(ctx, 1, allreduce.Bucket{ID: 0, Codec: c, Data: inputs[i], Out: outs[i]})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
	}
	return outs, want
}

// TestDirectLinksFollowTheConfig: with allreduce.direct_links (the
// default) a cluster's all-reduce frames go over direct links; with it
// false, over the libp2p streams; the averages agree bit for bit.
func TestDirectLinksFollowTheConfig(t *testing.T) {
	var results [][]float32
	for _, on := range []bool{true, false} {
		nodes, order, epoch := keyedCluster(t, 3, func(c *config.Config) { c.Allreduce.DirectLinks = on })
		outs, _ := allreduceOnce(t, nodes, order, epoch, "none", 100_003)
		for i, nd := range nodes {
			if got := nd.ring.DirectLinks(); (got > 0) != on {
				t.Fatalf("direct_links = %v: peer %d opened %d direct links", on, i, got)
			}
		}
		results = append(results, outs[0])
	}
	for j := range results[0] {
		if math.Float32bits(results[0][j]) != math.Float32bits(results[1][j]) {
			t.Fatalf("element %d: %v over direct links, %v over streams", j, results[0][j], results[1][j])
		}
	}
}

func TestAllreducePeerDiesMidRound(t *testing.T) {
	const size = 4 << 20
	nodes, order, epoch := keyedCluster(t, 3, nil)
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	started := make(chan struct{})
	var once sync.Once
	for i, nd := range nodes[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep := allreduce.Ring{Number: epoch, Peers: order, Self: order[i]}
			tr := nd.OpenTransport(ep)
			defer tr.Reset(nil)
			s, err := allreduce.NewSession(ep, tr, allreduce.Config{FrameTimeout: 20 * time.Second})
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			c, _ := compress.New("none", compress.Options{Layout: compress.FlatLayout(size)})
			data := make([]float32, size)
			once.Do(func() { close(started) })
			errs[i] = s.AllReduce(context.Background(), 1, allreduce.Bucket{Codec: c, Data: data, Out: data})
		}()
	}
	// The third peer never takes part and then crashes: the others must fail
	// with a typed error naming a peer, well before the frame timeout.
	<-started
	nodes[2].Kill()
	wg.Wait()
	for i, err := range errs[:2] {
		var pe *allreduce.PeerError
		if !errors.As(err, &pe) {
			t.Fatalf("peer %d: got %v, want a *allreduce.PeerError", i, err)
		}
		if !errors.Is(err, allreduce.ErrPeerFailed) && !errors.Is(err, allreduce.ErrTimeout) {
			t.Fatalf("peer %d: %v wraps neither ErrPeerFailed nor ErrTimeout", i, err)
		}
		t.Logf("peer %d: %v", i, err)
	}
}

// TestEpochsEndedGracefullyFreeTheirStreams: a transport closed at the end
// of its epoch releases its streams to the resource manager, which allows
// 8 all-reduce streams per peer and direction: twenty epochs in a row
// between the same peers all-reduce (streams only half-closed were never
// released, and the ninth epoch could not open one).
func TestEpochsEndedGracefullyFreeTheirStreams(t *testing.T) {
	for _, direct := range []bool{true, false} {
		nodes, order, epoch := keyedCluster(t, 2, func(c *config.Config) { c.Allreduce.DirectLinks = direct })
		for i := range uint64(20) {
			allreduceOnce(t, nodes, order, epoch+i, "none", 1000)
		}
	}
}
