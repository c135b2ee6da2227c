package allreduce_test

import (
	"math"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
)

// TestModelUniformClosedForm: over uniform links the recurrence of
// PassSeconds gives the closed form ChainSeconds, in the latency-bound and the
// bandwidth-bound regime, and Ring is one pass of 2(W−1) steps.
func TestModelUniformClosedForm(t *testing.T) {
	for _, l := range []allreduce.Link{{Alpha: 0.025, Beta: 125e6}, {Alpha: 1e-4, Beta: 125e6}, {Alpha: 0, Beta: 1e9}} {
		for _, w := range []int{2, 3, 16, 64} {
			for _, seg := range []int{1, 1000, 65536, 1 << 20} {
				for _, ce := range []int{256, 65536} {
					edges := make([]allreduce.Link, w)
					for i := range edges {
						edges[i] = l
					}
					frames := (seg + ce - 1) / ce
					m := float64(4*seg + allreduce.HeaderSize*frames)
					c := float64(4*min(seg, ce) + allreduce.HeaderSize)
					for _, n := range []int{1, 2, w - 1, 2 * (w - 1)} {
						want := allreduce.ChainSeconds(n, m, c, l)
						for _, got := range []float64{allreduce.PassRecurrence(edges, n, seg, ce), allreduce.PassSeconds(edges, n, seg, ce)} {
							if math.Abs(got-want) > 1e-9*want {
								t.Fatalf("%+v W=%d seg=%d chunk=%d n=%d: %g, closed form %g", l, w, seg, ce, n, got, want)
							}
						}
					}
				}
			}
			md := allreduce.Uniform(l, 4*1024)
			seg := ((1 << 20) + w - 1) / w // the largest segment
			m := float64(4*seg + allreduce.HeaderSize*((seg+1023)/1024))
			c := float64(4*min(seg, 1024) + allreduce.HeaderSize)
			if got, want := md.Ring(w, 4<<20), allreduce.ChainSeconds(2*(w-1), m, c, l); math.Abs(got-want) > 1e-9*want {
				t.Fatalf("%+v W=%d: Ring %g, want %g", l, w, got, want)
			}
		}
	}
}

// TestModelHierarchicalBeatsRingOnLatency: at 256 peers, 50 ms RTT and
// 1 Gbit/s the flat ring's 510 latency-bound steps cost more than 5× the
// hierarchy's 60 (16 groups of 16), the bytes per peer being equal; at 16
// peers on the same links both are bandwidth-bound and the ring wins.
func TestModelHierarchicalBeatsRingOnLatency(t *testing.T) {
	md := allreduce.Uniform(allreduce.Link{Alpha: 0.025, Beta: 125e6}, 0)
	ring, hier := md.Ring(256, 64<<20), md.Hierarchical(allreduce.DefaultGroups(256), 64<<20)
	if ring < 5*hier {
		t.Errorf("256 peers: ring %.3fs, hierarchical %.3fs: less than 5× apart", ring, hier)
	}
	// Latency-bound: every step of the ring costs α + 2c/β.
	c := float64(4*65536 + allreduce.HeaderSize)
	if want := 510 * (0.025 + 2*c/125e6); math.Abs(ring-want) > 0.01*want {
		t.Errorf("256 peers: ring %.3fs, want about 510·(α + 2c/β) = %.3fs", ring, want)
	}
	if r, h := md.Ring(16, 64<<20), md.Hierarchical(allreduce.DefaultGroups(16), 64<<20); r > h {
		t.Errorf("16 peers: ring %.3fs slower than hierarchical %.3fs", r, h)
	}
}
