package plan

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
)

func uniform(n int, v float64) Matrix {
	m := make(Matrix, n)
	for i := range m {
		m[i] = make([]float64, n)
		for j := range m[i] {
			m[i][j] = v
		}
	}
	return m
}

// bruteBottleneck is the optimum by enumeration (n ≤ 8).
func bruteBottleneck(m Matrix) float64 {
	n := len(m)
	best := 0.0
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	var rec func(k int)
	rec = func(k int) {
		if k == n {
			best = math.Max(best, Bottleneck(m, perm))
			return
		}
		for i := k; i < n; i++ {
			perm[k], perm[i] = perm[i], perm[k]
			rec(k + 1)
			perm[k], perm[i] = perm[i], perm[k]
		}
	}
	rec(1)
	return best
}

func TestRingOrderOptimalSmall(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		n := 2 + r.IntN(6)
		m := uniform(n, 0)
		for i := range m {
			for j := range m {
				m[i][j] = float64(1 + r.IntN(10))
			}
		}
		o := RingOrder(m)
		seen := map[int]bool{}
		for _, p := range o {
			seen[p] = true
		}
		if len(o) != n || len(seen) != n || o[0] != 0 {
			t.Fatalf("bad order %v", o)
		}
		if got, want := Bottleneck(m, o), bruteBottleneck(m); got < want {
			t.Errorf("trial %d n=%d: bottleneck %v < optimum %v (%v)", trial, n, got, want, o)
		}
		if o2 := RingOrder(m); !equalInts(o, o2) {
			t.Fatalf("not deterministic: %v vs %v", o, o2)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRingOrderTwoRacks: peers 0-3 and 4-7 are in two racks joined by slow
// links except one fast pair in each direction; the ring must cross once each way.
func TestRingOrderTwoRacks(t *testing.T) {
	m := uniform(64, 0)
	rack := func(i int) int { return i % 2 }
	for i := range m {
		for j := range m {
			if rack(i) == rack(j) {
				m[i][j] = 10
			} else {
				m[i][j] = 1
			}
		}
	}
	m[2][5], m[7][4] = 10, 10
	o := RingOrder(m)
	if b := Bottleneck(m, o); b != 10 {
		t.Fatalf("bottleneck %v, want 10: %v", b, o)
	}
}

func TestShares(t *testing.T) {
	// 1 slow + 3 fast (10×): the slow peer owns nothing, the others a third each.
	w := Shares([]float64{1, 10, 10, 10})
	if w[0] != 0 || math.Abs(w[1]-1.0/3) > 1e-9 {
		t.Fatalf("shares %v", w)
	}
	// Equal rates: equal shares.
	w = Shares([]float64{5, 5, 5, 5, 5})
	for _, x := range w {
		if math.Abs(x-0.2) > 1e-9 {
			t.Fatalf("shares %v", w)
		}
	}
	// Moderate spread: every positive-share peer finishes at the same time.
	b := []float64{3, 4, 5, 6}
	w = Shares(b)
	sum, t0 := 0.0, -1.0
	for i := range b {
		sum += w[i]
		if w[i] > 0 {
			ti := (1 + 2*w[i]) / b[i]
			if t0 >= 0 && math.Abs(ti-t0) > 1e-9 {
				t.Fatalf("unequal times: shares %v", w)
			}
			t0 = ti
		}
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Fatalf("shares sum %v", sum)
	}
}

func TestChoose(t *testing.T) {
	mbit := 1e6 / 8
	m := mbitMatrix(slowPeer(4, 100, 1000))
	p := Choose(m, 64<<20)
	if p.Schedule != allreduce.ScheduleProportional || p.Shares[0] != 0 {
		t.Fatalf("plan %+v", p)
	}
	if g := p.RingSeconds / p.ProportionalSeconds; g < 1.4 {
		t.Fatalf("predicted gain %v", g)
	}
	if p := Choose(uniform(4, 1000*mbit), 64<<20); p.Schedule != allreduce.ScheduleRing {
		t.Fatalf("uniform: %+v", p)
	}
}

// TestChooseLinks: where Choose picks proportional shares around a slow
// peer, fp16 on that peer's ring links is predicted faster and replaces
// them; a codec without a stronger variant keeps the shares, and uniform
// links keep the plain ring.
func TestChooseLinks(t *testing.T) {
	mbit := 1e6 / 8
	m := mbitMatrix(slowPeer(4, 100, 1000))
	p, edges, final, err := ChooseLinks(m, 64<<20, "none", "")
	if err != nil || p.Schedule != allreduce.ScheduleRing || p.Shares != nil || final != "fp16" || len(edges) != 4 {
		t.Fatalf("ChooseLinks = %+v, %v, %q, %v; want the ring with fp16 links", p, edges, final, err)
	}
	for k, e := range edges {
		slow := p.Order[k] == 0 || p.Order[(k+1)%4] == 0
		if (e == "fp16") != slow {
			t.Errorf("edge %d (%d → %d) has %s", k, p.Order[k], p.Order[(k+1)%4], e)
		}
	}
	want, err := LinkPlanSeconds(m, p.Order, 64<<20, "none", edges, final)
	if err != nil || !(want < p.ProportionalSeconds) {
		t.Errorf("predicted %v s with links, %v s with shares", want, p.ProportionalSeconds)
	}
	two, _ := allreduce.CanonicalLinkCodec("qsgd:bits=2")
	if p, edges, _, err := ChooseLinks(m, 64<<20, two, ""); err != nil || p.Schedule != allreduce.ScheduleProportional || edges != nil {
		t.Errorf("qsgd:bits=2 (no stronger variant): %+v %v %v; want the shares", p, edges, err)
	}
	if p, edges, _, err := ChooseLinks(uniform(4, 1000*mbit), 64<<20, "none", ""); err != nil || p.Schedule != allreduce.ScheduleRing || edges != nil {
		t.Errorf("uniform: %+v %v %v; want the plain ring", p, edges, err)
	}
	if _, err := LinkPlanSeconds(m, p.Order, 1, "none", edges[:2], final); !errors.Is(err, allreduce.ErrConfig) {
		t.Errorf("2 codecs for a ring of 4: %v, want allreduce.ErrConfig", err)
	}
}

func TestLinkSpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		slow float64
		want string
	}{
		{"none", 1, "none"}, {"none", 4, "fp16"},
		{"qsgd:bits=8", 1, "qsgd:bits=8,block=512,norm=l2"},
		{"qsgd:bits=8", 2, "qsgd:bits=4,block=512,norm=l2"},
		{"qsgd:bits=8", 10, "qsgd:bits=2,block=512,norm=l2"},
		{"qsgd:bits=4", 3, "qsgd:bits=2,block=512,norm=l2"},
		{"topk:ratio=0.01", 10, "topk:ratio=0.001,dgc=false"},
		{"onebit", 10, "onebit:block=2048"},
	} {
		got, err := EdgeCodec(tc.spec, tc.slow)
		if err != nil || got != tc.want {
			t.Errorf("EdgeCodec(%q, %v) = %q, %v; want %q", tc.spec, tc.slow, got, err, tc.want)
		}
	}
	m := uniform(3, 100)
	m[1][2] = 25
	s, final, err := EdgeCodecs("qsgd:bits=8", m, []int{0, 1, 2}, "")
	if err != nil || s[0] != "qsgd:bits=8,block=512,norm=l2" || s[1] != "qsgd:bits=2,block=512,norm=l2" ||
		s[2] != s[0] || final != s[1] {
		t.Fatalf("EdgeCodecs = %v, %q, %v", s, final, err)
	}
	// The override replaces only the slow edge, and is the final spec.
	if s, final, _ := EdgeCodecs("qsgd", m, []int{0, 1, 2}, "int8"); s[1] != "int8:block=2048" || s[0] != "qsgd:bits=4,block=512,norm=l2" || final != s[1] {
		t.Fatalf("override: %v, %q", s, final)
	}
	// A ring a little uneven (below SlowLink) keeps fp32 everywhere.
	m = uniform(3, 100)
	m[2][0] = 80
	if s, final, _ := EdgeCodecs("none", m, []int{0, 1, 2}, "fp16"); !slices.Equal(s, []string{"none", "none", "none"}) || final != "none" {
		t.Fatalf("even ring: %v, %q", s, final)
	}
	// Unknown edges count as fast.
	if s, final, err := EdgeCodecs("none", make(Matrix, 3), []int{0, 1, 2}, ""); err != nil || final != "none" || s[1] != "none" {
		t.Fatalf("unknown ring: %v, %q, %v", s, final, err)
	}
	if _, _, err := EdgeCodecs("none", m, []int{0, 1, 2}, "bogus"); !errors.Is(err, allreduce.ErrConfig) {
		t.Fatalf("bad override: %v", err)
	}
}

func TestLinkRingSeconds(t *testing.T) {
	m := uniform(4, 100)
	m[1][2] = 25
	o := []int{0, 1, 2, 3}
	ones := []float64{1, 1, 1, 1}
	if got, want := LinkRingSeconds(m, o, 800, ones, 1), RingSeconds(m, o, 800); math.Abs(got-want) > 1e-12 {
		t.Fatalf("all fp32: %v, want RingSeconds %v", got, want)
	}
	// Halving the slow edge's bytes in both phases halves the time.
	if got, want := LinkRingSeconds(m, o, 800, []float64{1, 0.5, 1, 1}, 0.5), RingSeconds(m, o, 800)/2; math.Abs(got-want) > 1e-12 {
		t.Fatalf("fp16 on the slow edge: %v, want %v", got, want)
	}
	for spec, want := range map[string]float64{"none": 1, "fp16": 0.5, "bf16": 0.5} {
		if f, err := EncodedFraction(spec); err != nil || f != want {
			t.Errorf("EncodedFraction(%q) = %v, %v; want %v", spec, f, err, want)
		}
	}
	if f, err := EncodedFraction("qsgd:bits=2"); err != nil || f <= 0 || f >= 0.1 {
		t.Errorf("EncodedFraction(qsgd:bits=2) = %v, %v", f, err)
	}
	if _, err := EncodedFraction("bogus"); !errors.Is(err, allreduce.ErrConfig) {
		t.Errorf("EncodedFraction(bogus): %v", err)
	}
	for spec, ok := range map[string]bool{"none": true, "fp16": true, "qsgd:bits=4": true, "int8": true, "sint8": false, "onebit": false, "topk": false, "acpsgd": false, "bogus": false} {
		c, err := allreduce.CanonicalLinkCodec(spec)
		if (err == nil) != ok || (ok && c == "") {
			t.Errorf("allreduce.CanonicalLinkCodec(%q) = %q, %v; want ok=%v", spec, c, err, ok)
		}
	}
}

// TestRingOrderLargeClusteredRing: 256 peers in racks of 8 with fast links
// inside a rack and between neighbouring racks only (a chain of switches
// closed into a loop); the ring must use fast links everywhere, found by the
// bounded search that keeps planning at milliseconds for large rings.
func TestRingOrderLargeClusteredRing(t *testing.T) {
	const n, rack = 256, 8
	racks := n / rack
	m := uniform(n, 0)
	for i := range m {
		for j := range m {
			d := (j/rack - i/rack + racks) % racks
			if d == 0 || d == 1 {
				m[i][j] = 100
			} else {
				m[i][j] = 1
			}
		}
	}
	o := RingOrder(m)
	if b := Bottleneck(m, o); b != 100 {
		t.Fatalf("bottleneck %v, want 100", b)
	}
	seen := make([]bool, n)
	for _, p := range o {
		if seen[p] {
			t.Fatalf("peer %d twice in %v", p, o)
		}
		seen[p] = true
	}
	if len(o) != n || o[0] != 0 {
		t.Fatalf("order of %d peers starting at %d, want %d from peer 0", len(o), o[0], n)
	}
}
