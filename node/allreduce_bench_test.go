package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/allreducebench"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/node/nodetest"
)

// BenchmarkAllreduceLibp2p is the CPU cost per byte of the all-reduce data
// path over real libp2p connections (loopback TCP; the swarm key in either
// node.swarm_key_mode, or none; the node's stream muxer): 4 peers in this process all-reduce an fp32
// buffer around the ring once per iteration. The link is loopback, so the
// machine's CPUs bound it; cpu-s/GB is the process's CPU time (user and
// system) per GB of buffer all-reduced, divided by the peers: what one
// daemon spends, comparable to `bench allreduce`'s cpu_s_per_gb.
func BenchmarkAllreduceLibp2p(b *testing.B) {
	for _, mode := range []string{config.SwarmKeyNoise, config.SwarmKeyPnet, "open"} {
		b.Run(mode, func(b *testing.B) {
			key := ""
			if mode != "open" {
				key = filepath.Join(b.TempDir(), "swarm.key")
				if err := WriteSwarmKey(key); err != nil {
					b.Fatal(err)
				}
			}
			benchAllreduce(b, 4, 16<<20, func(cfg *config.Config) {
				cfg.Node.SwarmKey = key
				if key != "" {
					cfg.Node.SwarmKeyMode = mode
				}
			})
		})
	}
}

// benchAllreduce starts w loopback peers configured by set, waits for their
// ring and all-reduces size bytes of fp32 b.N times.
func benchAllreduce(b *testing.B, w, size int, set func(*config.Config)) {
	start := func(bootstrap ...string) *Node {
		cfg := nodetest.Config(bootstrap...)
		set(&cfg)
		n, err := New(context.Background(), cfg, zap.NewNop())
		if err != nil {
			b.Fatalf("start node: %v", err)
		}
		b.Cleanup(func() { n.Kill() })
		return n
	}
	nodes := []*Node{start()}
	for i := 1; i < w; i++ {
		nodes = append(nodes, start(nodes[0].AddrStrings()[0]))
	}
	nodetest.Eventually(b, 20*time.Second, "peers agree", func() error { return agreeOn(nodes, ids(nodes)) })
	_, ep := nodes[0].Gossip().Snapshot()
	byID := map[string]*Node{}
	for _, nd := range nodes {
		byID[nd.ID().String()] = nd
	}
	order := make([]allreduce.PeerID, 0, w)
	for _, p := range ep.Order {
		order = append(order, allreduce.PeerID(p))
	}
	n := size / 4
	sessions := make([]*allreduce.Session, w)
	codecs := make([]compress.Codec, w)
	data, out := make([][]float32, w), make([][]float32, w)
	for i, p := range order {
		ring := allreduce.Ring{Number: ep.Number + 1000, Peers: order, Self: p}
		tr := byID[string(p)].OpenTransport(ring)
		s, err := allreduce.NewSession(ring, tr, allreduce.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close(); tr.Close() })
		sessions[i] = s
		if codecs[i], err = compress.New("none", compress.Options{Layout: compress.FlatLayout(n)}); err != nil {
			b.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(i), 1))
		data[i], out[i] = make([]float32, n), make([]float32, n)
		for k := range data[i] {
			data[i][k] = float32(r.NormFloat64())
		}
	}
	round := func(step uint64) error {
		errs := make([]error, w)
		var wg sync.WaitGroup
		for i := range sessions {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				errs[i] = sessions[i].AllReduce(ctx, step, allreduce.Bucket{Codec: codecs[i], Data: data[i], Out: out[i]})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				return fmt.Errorf("peer %d: %w", i, err)
			}
		}
		return nil
	}
	if err := round(1); err != nil { // warm-up: streams open, buffers grow
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu := allreducebench.ProcessCPU()
	for i := range b.N {
		if err := round(uint64(i + 2)); err != nil {
			b.Fatal(err)
		}
	}
	cpu = allreducebench.ProcessCPU() - cpu
	b.StopTimer()
	b.ReportMetric(cpu.Seconds()/float64(w)/(float64(size)*float64(b.N)/1e9), "cpu-s/GB")
}
