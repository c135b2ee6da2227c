package allreduce

import (
	"math"
	"slices"
)

// Link is the α–β figure of a link between two peers: Alpha is its one-way
// latency in seconds (half the round-trip time) and Beta the rate of the
// sender's and the receiver's interface in bytes/s.
type Link struct {
	Alpha, Beta float64
}

// Model is the α–β time model of this package's ring schedules for an fp32
// (codec none) bucket; docs/scale.md derives it.
//
// A ring pass moves one segment of m wire bytes over every ring edge per
// step, pipelined in frames of at most c bytes (a chunk and its header).
// A frame leaves the sender's interface (c/β), crosses the link (α), and
// enters the receiver's interface (c/β) before the receiver can add its data
// and send it on: the store-and-forward of memtransport's shaped peers. The
// first frame of step k+1 can thus leave a peer α + 2c/β after the first
// frame of step k left the previous one, and no sooner than m/β after the
// peer started sending step k. Over uniform links every step costs
// max(α + 2c/β, m/β) and a pass of n steps takes (ChainSeconds)
//
//	T(n) = (n−1)·max(α + 2c/β, m/β) + m/β + α + c/β.
//
// The flat ring of W peers is one pass of 2(W−1) steps with m ≈ S/W. The
// hierarchical schedule with G groups of g is a group pass of g−1 steps
// (m ≈ S/g), a cross-group pass of 2(G−1) steps (m ≈ S/W) and a group pass
// of g−1 steps again, one after the other. With non-uniform links Ring and Hierarchical run the
// recurrence behind T(n) edge by edge (PassSeconds).
//
// CPU time is not part of the model: it is what the engine achieves over
// memtransport in virtual time (testing/synctest), where computing takes
// none.
type Model struct {
	// Link returns the link from rank a to rank b of the ring.
	Link func(a, b int) Link
	// ChunkBytes is the pipeline chunk, Config.ChunkBytes (0: the default).
	ChunkBytes int
}

// Uniform returns a Model whose links all have figure l.
func Uniform(l Link, chunkBytes int) Model {
	return Model{Link: func(int, int) Link { return l }, ChunkBytes: chunkBytes}
}

// wire returns the wire bytes of a segment of e fp32 values cut into chunks
// of ce values, and those of its first (largest) frame.
func wire(e, ce int) (m, c float64) {
	if e <= 0 {
		return 0, 0
	}
	frames := (e + ce - 1) / ce
	return float64(4*e + HeaderSize*frames), float64(4*min(e, ce) + HeaderSize)
}

// ChainSeconds is the time of a pass of n ring steps, each moving a segment
// of m wire bytes in frames of at most c bytes, over uniform links l:
// (n−1)·max(α + 2c/β, m/β) + m/β + α + c/β, and 0 for no step.
func ChainSeconds(n int, m, c float64, l Link) float64 {
	if n <= 0 || m <= 0 {
		return 0
	}
	return float64(n-1)*math.Max(l.Alpha+2*c/l.Beta, m/l.Beta) + m/l.Beta + l.Alpha + c/l.Beta
}

// PassSeconds is the time of a pass of n steps around a ring whose edge i
// (from position i to i+1) has figure edges[i], moving segments of segElems
// fp32 values in chunks of chunkElems. It runs the recurrence on U[i][k],
// when position i's first frame of step k has left its interface:
//
//	U[i][0]   = c/βᵢ
//	U[i][k+1] = max(U[i−1][k] + αᵢ₋₁ + c/βᵢ₋₁ + c/βᵢ + (q−1)·c·(1/βᵢ₋₁ − 1/βᵢ)⁺,  U[i][k] + m/βᵢ)
//
// (q frames a segment; the third term keeps a fast sender behind a slow
// upstream link), and ends when the last frame of the last step has entered
// the next peer: max over i of U[i][n−1] + (m − c)/βᵢ + αᵢ + c/βᵢ.
func PassSeconds(edges []Link, n, segElems, chunkElems int) float64 {
	w := len(edges)
	if n <= 0 || w < 2 || segElems <= 0 {
		return 0
	}
	chunkElems = max(chunkElems, 1)
	m, c := wire(segElems, chunkElems)
	if !slices.ContainsFunc(edges, func(e Link) bool { return e != edges[0] }) {
		return ChainSeconds(n, m, c, edges[0]) // the recurrence's closed form
	}
	return passRecurrence(edges, n, segElems, chunkElems, m, c)
}

// passRecurrence runs PassSeconds' recurrence.
func passRecurrence(edges []Link, n, segElems, chunkElems int, m, c float64) float64 {
	w := len(edges)
	q := float64((segElems + chunkElems - 1) / chunkElems)
	u := make([]float64, w)
	// hop[i]: from U[i−1][k] to U[i][k+1] through edge i−1; busy[i]: from
	// U[i][k] to U[i][k+1] on position i's interface.
	hop, busy := make([]float64, w), make([]float64, w)
	for i, e := range edges {
		p := edges[(i+w-1)%w]
		u[i] = c / e.Beta
		hop[i] = p.Alpha + c/p.Beta + c/e.Beta + math.Max(0, (q-1)*c*(1/p.Beta-1/e.Beta))
		busy[i] = m / e.Beta
	}
	next := make([]float64, w)
	for k := 1; k < n; k++ {
		next[0] = max(u[w-1]+hop[0], u[0]+busy[0])
		for i := 1; i < w; i++ {
			next[i] = max(u[i-1]+hop[i], u[i]+busy[i])
		}
		u, next = next, u
	}
	end := 0.0
	for i, e := range edges {
		end = max(end, u[i]+(m-c)/e.Beta+e.Alpha+c/e.Beta)
	}
	return end
}

func (md Model) chunkElems() int {
	cb := md.ChunkBytes
	if cb <= 0 {
		cb = DefaultChunkBytes
	}
	return max(cb/4, 1)
}

// ringEdges returns the edges of the ring through ranks, in order.
func (md Model) ringEdges(ranks []int) []Link {
	e := make([]Link, len(ranks))
	for i, a := range ranks {
		e[i] = md.Link(a, ranks[(i+1)%len(ranks)])
	}
	return e
}

// Ring predicts the flat ring all-reduce of a bucket of bytes (fp32) over
// ranks 0 … w−1 in order: one pass of 2(w−1) steps of ⌈n/w⌉ values.
func (md Model) Ring(w, bytes int) float64 {
	if w < 2 {
		return 0
	}
	ranks := make([]int, w)
	for i := range ranks {
		ranks[i] = i
	}
	n := bytes / 4
	return PassSeconds(md.ringEdges(ranks), 2*(w-1), (n+w-1)/w, md.chunkElems())
}

// Hierarchical predicts ScheduleHierarchical with groups of consecutive
// ranks of the given sizes for a bucket of bytes (fp32): twice the slowest
// group pass (g−1 steps of the largest member's columns) plus the slowest
// member's cross-group passes (2(G−1) steps of one column's piece; a member
// owning k columns runs min(k, crossLanes) of their rings at once, which
// the model counts as one ring moving that many pieces a step). It is
// exact within the model for equal groups and an estimate otherwise.
func (md Model) Hierarchical(groups []int, bytes int) float64 {
	w := 0
	for _, g := range groups {
		w += g
	}
	if w < 2 {
		return 0
	}
	h := newHierGroups(groups, 0)
	n, ce := bytes/4, md.chunkElems()
	colElems := (n + h.cols - 1) / h.cols
	pieceElems := (colElems + len(groups) - 1) / len(groups)
	group, cross := 0.0, 0.0
	// crossRing[[2]int{c, lanes}] is the time of column c's ring carrying
	// lanes pieces a step.
	crossRing := make(map[[2]int]float64)
	for k, g := range groups {
		ranks := make([]int, g)
		most := 0
		for j := range ranks {
			ranks[j] = h.first[k] + j
			a, b := h.colsOf(k, j)
			most = max(most, b-a)
			if len(groups) < 2 {
				continue
			}
			lanes := min(b-a, crossLanes)
			key := [2]int{a, lanes}
			t, ok := crossRing[key]
			if !ok {
				x := make([]int, len(groups))
				for kk := range groups {
					x[kk] = h.owner(kk, a)
				}
				t = PassSeconds(md.ringEdges(x), 2*(len(groups)-1), lanes*pieceElems, ce)
				crossRing[key] = t
			}
			cross = math.Max(cross, float64((b-a+lanes-1)/lanes)*t)
		}
		if g > 1 {
			group = math.Max(group, PassSeconds(md.ringEdges(ranks), g-1, most*colElems, ce))
		}
	}
	return 2*group + cross
}
