// Ring planning: the ring order that maximises the slowest edge, owner
// shares for the proportional schedule, and the predicted times that choose
// between them.

package plan

import (
	"math"
	"math/bits"
	"slices"

	"github.com/p2ptrain/p2ptrain/allreduce"
)

// Matrix holds measured throughput in bytes/s: m[i][j] from peer i to peer
// j (the diagonal is ignored; 0 means unknown or unreachable).
type Matrix [][]float64

// At returns m[i][j], or 0 (unknown) for the diagonal, indices outside m
// and values that are not a rate.
func (m Matrix) At(i, j int) float64 { return m.at(i, j) }

func (m Matrix) at(i, j int) float64 {
	if i == j || i < 0 || j < 0 || i >= len(m) || j >= len(m[i]) {
		return 0
	}
	v := m[i][j]
	if v < 0 || math.IsNaN(v) {
		return 0
	}
	return v
}

// edges returns the ring's edge weights m[o[k]][o[k+1]] sorted ascending.
func edges(m Matrix, o []int, buf []float64) []float64 {
	buf = buf[:0]
	for k := range o {
		buf = append(buf, m.at(o[k], o[(k+1)%len(o)]))
	}
	// insertion sort: n ≤ 64
	for i := 1; i < len(buf); i++ {
		for j := i; j > 0 && buf[j] < buf[j-1]; j-- {
			buf[j], buf[j-1] = buf[j-1], buf[j]
		}
	}
	return buf
}

// better reports whether sorted edge list a beats b (lexicographically larger:
// a larger bottleneck first, then a larger second-slowest edge, ...).
func better(a, b []float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return false
}

// Bottleneck returns the slowest edge of ring order o.
func Bottleneck(m Matrix, o []int) float64 {
	if len(o) < 2 {
		return math.Inf(1)
	}
	return edges(m, o, nil)[0]
}

// localSearchMax is the largest ring RingOrder improves with 2-opt and
// or-opt moves: a pass tries O(n²) moves at O(n log n) each, seconds at
// 128 peers. Larger rings keep the greedy order and the threshold search.
const localSearchMax = 16

// greedyStarts bounds the greedy constructions of a ring larger than
// localSearchMax (smaller rings start from every peer), and the starts of
// the threshold search above thoroughMax.
const greedyStarts = 8

// thoroughMax is the largest ring whose threshold search starts from every
// peer with a generous budget (a ring that must cross between clusters at
// one pair of peers is found from few starts only); above it the search
// is bounded to a few linear-cost attempts per threshold.
const thoroughMax = 64

// RingOrder returns a ring order of the len(m) peers that maximises the
// slowest edge (a bottleneck travelling-salesman heuristic): greedy
// constructions, then for rings up to localSearchMax peers 2-opt and or-opt
// moves until no move helps (ties broken by the next-slowest edges), then a
// search for a ring whose every edge reaches a higher threshold. It is
// deterministic and starts at peer 0; at 256 peers it takes milliseconds.
func RingOrder(m Matrix) []int {
	n := len(m)
	if n <= 3 {
		o := make([]int, n)
		for i := range o {
			o[i] = i
		}
		if n == 3 && better(edges(m, []int{0, 2, 1}, nil), edges(m, o, nil)) {
			o = []int{0, 2, 1}
		}
		return o
	}
	var best []int
	var bestE, e1 []float64
	starts := n
	if n > localSearchMax {
		starts = greedyStarts
	}
	for k := range starts {
		o := greedy(m, k*n/starts)
		if best == nil || better(edges(m, o, e1), bestE) {
			best = o
			bestE = append(bestE[:0], edges(m, o, e1)...)
		}
	}
	if n <= localSearchMax {
		best, bestE = localSearch(m, best, bestE)
	}
	// Threshold search: the highest edge value v above the current
	// bottleneck for which a ring with every edge ≥ v is found (binary
	// search: a ring that reaches v also reaches every lower value).
	vals := distinct(m)
	lo := 0
	for lo < len(vals) && vals[lo] <= bestE[0] {
		lo++
	}
	hi := len(vals) - 1
	for lo <= hi {
		mid := (lo + hi) / 2
		if found := thresholdRing(m, vals[mid]); found != nil {
			best = found
			bestE = append(bestE[:0], edges(m, best, e1)...)
			lo = mid + 1
		} else {
			hi = mid - 1
		}
	}
	// rotate so that peer 0 comes first.
	for k, p := range best {
		if p == 0 {
			return append(append([]int(nil), best[k:]...), best[:k]...)
		}
	}
	return best
}

// localSearch improves ring best (whose sorted edges are bestE) with 2-opt
// (reverse a stretch) and or-opt (move one peer) moves until none helps.
func localSearch(m Matrix, best []int, bestE []float64) ([]int, []float64) {
	n := len(best)
	var e2 []float64
	cand := make([]int, n)
	for pass := 0; pass < 100; pass++ {
		improved := false
		for i := 1; i < n-1; i++ {
			for j := i + 1; j < n; j++ {
				copy(cand, best)
				for a, b := i, j; a < b; a, b = a+1, b-1 {
					cand[a], cand[b] = cand[b], cand[a]
				}
				if e2 = edges(m, cand, e2); better(e2, bestE) {
					copy(best, cand)
					bestE = append(bestE[:0], e2...)
					improved = true
				}
			}
		}
		for i := 1; i < n; i++ {
			for j := 1; j < n; j++ {
				if i == j {
					continue
				}
				cand = moveOne(cand[:0], best, i, j)
				if e2 = edges(m, cand, e2); better(e2, bestE) {
					copy(best, cand)
					bestE = append(bestE[:0], e2...)
					improved = true
				}
			}
		}
		if !improved {
			break
		}
	}
	return best, bestE
}

// thresholdRing looks for a ring whose every edge is ≥ tau, from a few
// starting peers with a bounded search each (nil: none found).
func thresholdRing(m Matrix, tau float64) []int {
	n := len(m)
	starts, budget := n, 20000
	switch {
	case n > thoroughMax:
		starts, budget = greedyStarts, 4*n
	case n > localSearchMax:
		budget = 2000
	}
	adj := make([]bitset, n)
	for i := range adj {
		adj[i] = newBitset(n)
		for j := 0; j < n; j++ {
			if m.at(i, j) >= tau {
				adj[i].set(j)
			}
		}
	}
	for k := range starts {
		b := budget
		if found := hamCycle(m, adj, tau, k*n/starts, &b); found != nil {
			return found
		}
	}
	return nil
}

// distinct returns the positive values of m, sorted ascending, once each.
func distinct(m Matrix) []float64 {
	var v []float64
	for i := range m {
		for j := range m {
			if x := m.at(i, j); x > 0 {
				v = append(v, x)
			}
		}
	}
	slices.Sort(v)
	return slices.Compact(v)
}

// bitset is a set of peer indices.
type bitset []uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (b bitset) set(i int)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) clear(i int)    { b[i/64] &^= 1 << (i % 64) }
func (b bitset) has(i int) bool { return b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) countAnd(c bitset) int {
	n := 0
	for w := range b {
		n += bits.OnesCount64(b[w] & c[w])
	}
	return n
}

// hamCycle looks for a directed Hamiltonian cycle from start using only
// edges ≥ tau (adj[i]: the peers i reaches so): depth-first, fewest onward
// options first (Warnsdorff), peers that can close the cycle last; at most
// *budget expansions.
func hamCycle(m Matrix, adj []bitset, tau float64, start int, budget *int) []int {
	n := len(m)
	unused := newBitset(n)
	for i := range n {
		unused.set(i)
	}
	unused.clear(start)
	path := []int{start}
	type cand struct{ j, deg, closes int }
	var rec func() bool
	rec = func() bool {
		*budget--
		if *budget < 0 {
			return false
		}
		cur := path[len(path)-1]
		if len(path) == n {
			return m.at(cur, start) >= tau
		}
		var cs []cand
		for w, word := range adj[cur] {
			for word &= unused[w]; word != 0; word &= word - 1 {
				j := w*64 + bits.TrailingZeros64(word)
				closes := 0
				if adj[j].has(start) {
					closes = 1
				}
				// j's onward options among the unused peers (adj has no
				// diagonal: m.at(j, j) is 0, below any tau).
				cs = append(cs, cand{j, adj[j].countAnd(unused), closes})
			}
		}
		slices.SortStableFunc(cs, func(a, b cand) int {
			if a.closes != b.closes {
				return a.closes - b.closes
			}
			return a.deg - b.deg
		})
		for _, c := range cs {
			unused.clear(c.j)
			path = append(path, c.j)
			if rec() {
				return true
			}
			path = path[:len(path)-1]
			unused.set(c.j)
			if *budget < 0 {
				return false
			}
		}
		return false
	}
	if rec() {
		return path
	}
	return nil
}

func moveOne(dst, o []int, i, j int) []int {
	x := o[i]
	for k, p := range o {
		if k == i {
			continue
		}
		if k == j && j < i {
			dst = append(dst, x)
		}
		dst = append(dst, p)
		if k == j && j > i {
			dst = append(dst, x)
		}
	}
	return dst
}

func greedy(m Matrix, start int) []int {
	n := len(m)
	used := make([]bool, n)
	o := []int{start}
	used[start] = true
	for len(o) < n {
		cur, nb, nv := o[len(o)-1], -1, -1.0
		for j := 0; j < n; j++ {
			if !used[j] && m.at(cur, j) > nv {
				nb, nv = j, m.at(cur, j)
			}
		}
		used[nb] = true
		o = append(o, nb)
	}
	return o
}

// PeerRates estimates each peer's interface rate from the matrix: the lower
// of its best uplink and best downlink (a slow NIC shows on every pair).
func PeerRates(m Matrix) []float64 {
	n := len(m)
	r := make([]float64, n)
	for i := 0; i < n; i++ {
		up, down := 0.0, 0.0
		for j := 0; j < n; j++ {
			up = math.Max(up, m.at(i, j))
			down = math.Max(down, m.at(j, i))
		}
		r[i] = math.Min(up, down)
	}
	return r
}

// Shares returns the bandwidth-proportional owner shares for peers with
// interface rates b (a water-filling closed form, docs/data-path.md): peer i
// sends and receives bytes·(1 + (n−2)·w_i) under the proportional schedule,
// so w_i = max(0, (ξ·b_i − 1)/(n − 2)) with ξ chosen so Σw = 1 equalises the
// time of every peer with a positive share. n ≤ 2 or unknown rates give
// equal shares.
func Shares(b []float64) []float64 {
	n := len(b)
	w := make([]float64, n)
	eq := func() []float64 {
		for i := range w {
			w[i] = 1 / float64(n)
		}
		return w
	}
	if n <= 2 {
		return eq()
	}
	bmin, bmax := math.Inf(1), 0.0
	for _, x := range b {
		if !(x > 0) || math.IsInf(x, 0) {
			return eq()
		}
		bmin, bmax = math.Min(bmin, x), math.Max(bmax, x)
	}
	sum := func(xi float64) float64 {
		s := 0.0
		for _, x := range b {
			s += math.Max(0, (xi*x-1)/float64(n-2))
		}
		return s
	}
	lo, hi := 0.0, float64(n)/bmin
	for it := 0; it < 200; it++ {
		mid := (lo + hi) / 2
		if sum(mid) < 1 {
			lo = mid
		} else {
			hi = mid
		}
	}
	s := sum(hi)
	for i, x := range b {
		w[i] = math.Max(0, (hi*x-1)/float64(n-2)) / s
	}
	return w
}

// RingSeconds predicts the ring all-reduce time of bytes over order o:
// 2(W−1)/W · bytes / slowest edge.
func RingSeconds(m Matrix, o []int, bytes float64) float64 {
	w := float64(len(o))
	if w < 2 {
		return 0
	}
	return 2 * (w - 1) / w * bytes / Bottleneck(m, o)
}

// ProportionalSeconds predicts the proportional schedule's time with rates b
// and shares w: max_i bytes·(1 + (n−2)·w_i) / b_i.
func ProportionalSeconds(b, w []float64, bytes float64) float64 {
	n := len(b)
	if n < 2 {
		return 0
	}
	t := 0.0
	for i := range b {
		t = math.Max(t, bytes*(1+float64(n-2)*w[i])/b[i])
	}
	return t
}

// Choice is the outcome of Choose.
type Choice struct {
	// Order is the ring order, as indices into the matrix's peers; the next
	// epoch lists its peers in this order.
	Order []int
	// Schedule is allreduce.ScheduleRing or allreduce.ScheduleProportional.
	Schedule allreduce.Schedule
	// Shares are the proportional owner shares per rank of the ordered epoch
	// (Shares[k] belongs to peer Order[k]); nil for the ring.
	Shares []float64
	// RingSeconds and ProportionalSeconds are the predicted times.
	RingSeconds, ProportionalSeconds float64
}

// ProportionalGain is how much faster the proportional schedule must be
// predicted to be before Choose prefers it over the ring.
const ProportionalGain = 1.1

// Choose picks the ring order and, from the predicted times for a bucket of
// bytes, the ring or the bandwidth-proportional schedule.
func Choose(m Matrix, bytes int) Choice {
	o := RingOrder(m)
	p := Choice{Order: o, Schedule: allreduce.ScheduleRing}
	if len(o) < 2 {
		return p
	}
	p.RingSeconds = RingSeconds(m, o, float64(bytes))
	rates := PeerRates(m)
	ordered := make([]float64, len(o))
	for k, i := range o {
		ordered[k] = rates[i]
	}
	sh := Shares(ordered)
	p.ProportionalSeconds = ProportionalSeconds(ordered, sh, float64(bytes))
	if len(o) >= 3 && p.ProportionalSeconds*ProportionalGain < p.RingSeconds {
		p.Schedule = allreduce.ScheduleProportional
		p.Shares = sh
	}
	return p
}
