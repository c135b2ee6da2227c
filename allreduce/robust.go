package allreduce

import (
	"fmt"
	"math"
	"slices"

	"github.com/p2ptrain/p2ptrain/internal/finite"
)

// Robust configures robust aggregation (config key allreduce.robust): the
// owner of each part of a bucket combines the members' contributions with
// centered clipping (Karimireddy, He and Jaggi, ICML 2021) instead of
// their plain mean, so that one member's huge but finite contribution moves
// the result by a bounded amount. It needs every member's contribution at
// the owner, so a bucket with robust aggregation runs the direct schedule.
type Robust struct {
	// Tau is the clipping radius τ for a whole bucket: a chunk of n of its
	// N values clips at τ·√(n/N), so that deviations spread evenly over the
	// bucket are clipped alike whatever the chunking.
	Tau float64
	// Iters is the number L of clipping iterations.
	Iters int
}

// Enabled reports whether r asks for robust aggregation.
func (r *Robust) Enabled() bool { return r != nil && r.Tau > 0 && r.Iters > 0 }

func (r *Robust) validate() error {
	if r == nil {
		return nil
	}
	if !(r.Tau > 0) || math.IsInf(r.Tau, 0) || r.Iters < 1 || r.Iters > 100 {
		return fmt.Errorf("%w: robust aggregation needs τ > 0 (got %g) and 1..100 iterations (got %d)", ErrConfig, r.Tau, r.Iters)
	}
	return nil
}

// CenteredClip writes into v the centered-clipping aggregate of contribs
// (each as long as v), starting from v's contents, over iters iterations:
//
//	v ← v + (1/W) Σᵢ (gᵢ − v) · min(1, τ / ‖gᵢ − v‖)
//
// One contribution moves v by at most τ/W per iteration. The arithmetic is
// in float64 and in a fixed order, so every peer computing it from the same
// inputs gets the same bits. diff is scratch of len(v) (allocated when short).
func CenteredClip(v []float32, contribs [][]float32, tau float64, iters int, diff []float64) {
	n, w := len(v), len(contribs)
	if w == 0 {
		return
	}
	if cap(diff) < n {
		diff = make([]float64, n)
	}
	acc := diff[:n]
	for range iters {
		clear(acc)
		for _, g := range contribs {
			var norm2 float64
			for i, x := range g[:n] {
				d := float64(x) - float64(v[i])
				norm2 += d * d
			}
			scale := 1.0
			if norm := math.Sqrt(norm2); norm > tau {
				scale = tau / norm
			}
			for i, x := range g[:n] {
				acc[i] += (float64(x) - float64(v[i])) * scale
			}
		}
		for i := range v {
			v[i] = float32(float64(v[i]) + acc[i]/float64(w))
		}
	}
}

// coordinateMedian writes into v the coordinate-wise median of contribs
// (the mean of the middle two for an even count): the robust starting
// point of CenteredClip. col is scratch of len(contribs).
func coordinateMedian(v []float32, contribs [][]float32, col []float32) {
	w := len(contribs)
	for i := range v {
		for j, g := range contribs {
			col[j] = g[i]
		}
		slices.Sort(col[:w])
		if w%2 == 1 {
			v[i] = col[w/2]
		} else {
			v[i] = float32((float64(col[w/2-1]) + float64(col[w/2])) / 2)
		}
	}
}

// errNonFiniteContribution: a member's contribution (or the partial sum it
// forwarded) decodes to NaN or ±Inf.
var errNonFiniteContribution = fmt.Errorf("%w: its contribution holds NaN or ±Inf", ErrBadFrame)

// robustOps is the per-bucket state of robust aggregation.
type robustOps struct {
	tau   float64 // τ for the whole bucket
	n     int     // the bucket's length
	iters int
	// members are the decoded contributions of one chunk by rank; col and
	// diff are CenteredClip's and coordinateMedian's scratch.
	members [][]float32
	col     []float32
	diff    []float64
}

// robustFor returns the robust-aggregation state of a bucket of n values
// (nil when robust aggregation is off).
func (s *Session) robustFor(n int) *robustOps {
	if !s.cfg.Robust.Enabled() {
		return nil
	}
	return &robustOps{tau: s.cfg.Robust.Tau, n: max(n, 1), iters: s.cfg.Robust.Iters,
		members: make([][]float32, s.w), col: make([]float32, s.w)}
}

// decodeMember writes member j's contribution to chunk c into dst: this
// peer's own data (or, with error feedback, its own encoding decoded, as
// the others see it) or member j's decoded payload.
func (x *codecOps) decodeMember(dst []float32, c chunk, j int, contribs [][]byte) error {
	if j != x.rank {
		if err := x.codec.Decode(dst, contribs[j]); err != nil {
			return corrupt(j, err)
		}
		return nil
	}
	d := x.data[c.off : c.off+c.n]
	if !x.feedback {
		copy(dst, d)
		return nil
	}
	own, err := x.codec.Encode(x.tmpB[:0], d, x.pos(c, streamLocal, true))
	if err != nil {
		return err
	}
	x.tmpB = own
	if err := x.codec.Decode(dst, own); err != nil {
		return fmt.Errorf("decode own encoding: %w", err)
	}
	return nil
}

// nonFiniteMember returns the rank of the first other member whose
// contribution to chunk c is not finite, or -1.
func (x *codecOps) nonFiniteMember(c chunk, contribs [][]byte) int {
	t := make([]float32, c.n)
	for j := range x.w {
		if j != x.rank && x.decodeMember(t, c, j, contribs) == nil && finite.Has(t) {
			return j
		}
	}
	return -1
}

// reduceRobust is the owner's reduce with centered clipping: each member's
// contribution is decoded on its own (a non-finite one fails the round and
// names its sender), the aggregate starts at their coordinate-wise median
// and takes the configured clipping iterations at radius τ·√(n/N).
func (x *codecOps) reduceRobust(dst []byte, c chunk, contribs [][]byte) ([]byte, error) {
	r := x.robust
	for j := range x.w {
		if cap(r.members[j]) < c.n {
			r.members[j] = make([]float32, c.n)
		}
		r.members[j] = r.members[j][:c.n]
		if err := x.decodeMember(r.members[j], c, j, contribs); err != nil {
			return nil, err
		}
		if j != x.rank && finite.Has(r.members[j]) {
			return nil, corrupt(j, errNonFiniteContribution)
		}
	}
	t := x.scratch(c.n)
	coordinateMedian(t, r.members, r.col)
	if cap(r.diff) < c.n {
		r.diff = make([]float64, c.n)
	}
	CenteredClip(t, r.members, r.tau*math.Sqrt(float64(c.n)/float64(r.n)), r.iters, r.diff)
	return x.codec.Encode(dst, t, x.pos(c, streamOwner, false))
}
