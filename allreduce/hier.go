package allreduce

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
)

// maxHierPeers bounds the peers a hierarchical schedule name may describe,
// so that a name such as "hier-1x999999999" from a remote epoch cannot make
// this package allocate a huge group list.
const maxHierPeers = 1 << 16

// hierPrefix starts the name of a hierarchical schedule with explicit groups.
const hierPrefix = string(ScheduleHierarchical) + "-"

// Hierarchical reports whether s is ScheduleHierarchical, with default or
// explicit groups ("hier" or "hier-…").
func (s Schedule) Hierarchical() bool {
	return s == ScheduleHierarchical || strings.HasPrefix(string(s), hierPrefix)
}

// Groups returns the group sizes of hierarchical schedule s over w peers,
// in ring order: the explicit sizes of "hier-…" (which must add up to w) or,
// for plain "hier", DefaultGroups(w).
func (s Schedule) Groups(w int) ([]int, error) {
	if !s.Hierarchical() {
		return nil, fmt.Errorf("%w: schedule %q is not hierarchical", ErrConfig, s)
	}
	if s == ScheduleHierarchical {
		return DefaultGroups(w), nil
	}
	g, err := parseGroups(string(s))
	if err != nil {
		return nil, err
	}
	sum := 0
	for _, x := range g {
		sum += x
	}
	if sum != w {
		return nil, fmt.Errorf("%w: schedule %q has groups of %d peers for a ring of %d", ErrConfig, s, sum, w)
	}
	return g, nil
}

// parseGroups parses "hier-" followed by runs separated by "-": a run is a
// group size, or size "x" count for count groups of that size. Sizes and
// counts are positive decimal numbers without signs; at most maxHierPeers
// peers in all.
func parseGroups(s string) ([]int, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: schedule %q: %s (want hier-SIZE[xCOUNT][-SIZE[xCOUNT]...], e.g. hier-16x16)", ErrConfig, s, why)
	}
	body, ok := strings.CutPrefix(s, hierPrefix)
	if !ok {
		return nil, bad("no hier- prefix")
	}
	num := func(t string) (int, bool) {
		if t == "" || len(t) > 6 || strings.TrimLeft(t, "0123456789") != "" {
			return 0, false
		}
		v, err := strconv.Atoi(t)
		return v, err == nil && v > 0
	}
	var groups []int
	total := 0
	for _, run := range strings.Split(body, "-") {
		st, ct, hasCount := strings.Cut(run, "x")
		size, ok := num(st)
		if !ok {
			return nil, bad(fmt.Sprintf("group size %q", st))
		}
		count := 1
		if hasCount {
			if count, ok = num(ct); !ok {
				return nil, bad(fmt.Sprintf("group count %q", ct))
			}
		}
		if total += size * count; total > maxHierPeers {
			return nil, bad(fmt.Sprintf("more than %d peers", maxHierPeers))
		}
		for range count {
			groups = append(groups, size)
		}
	}
	return groups, nil
}

// HierarchicalSchedule returns the name of the hierarchical schedule with
// groups of the given sizes in ring order, run-length encoded: [16 16 15]
// is "hier-16x2-15". Sizes must be positive.
func HierarchicalSchedule(groups []int) Schedule {
	var b strings.Builder
	b.WriteString(string(ScheduleHierarchical))
	for i := 0; i < len(groups); {
		j := i
		for j < len(groups) && groups[j] == groups[i] {
			j++
		}
		fmt.Fprintf(&b, "-%d", groups[i])
		if j-i > 1 {
			fmt.Fprintf(&b, "x%d", j-i)
		}
		i = j
	}
	return Schedule(b.String())
}

// DefaultGroups is the grouping of plain "hier" for w peers (all links
// alike): groups of about g = round(√w) consecutive peers, ⌈w/g⌉ of them,
// sizes differing by at most one (the larger first). Both levels then have
// about √w peers, which minimises the schedule's 2(g−1) + 2(w/g − 1)
// latency-bound steps.
func DefaultGroups(w int) []int {
	if w < 1 {
		return nil
	}
	g := max(1, int(math.Round(math.Sqrt(float64(w)))))
	return BalancedGroups(w, (w+g-1)/g)
}

// BalancedGroups splits w peers into k groups of consecutive peers whose
// sizes differ by at most one, the larger first (k is clamped to [1, w]).
func BalancedGroups(w, k int) []int {
	k = min(max(k, 1), max(w, 1))
	out := make([]int, k)
	for i := range out {
		out[i] = w / k
		if i < w%k {
			out[i]++
		}
	}
	return out
}

// hierGroups is the group structure of a hierarchical session. The
// buffer is cut into cols columns (cols is the largest group's size) and
// each column into one piece per group. Member j of a group of g peers owns
// the columns [j·cols/g, (j+1)·cols/g): every member owns at least one, and
// in the largest groups exactly one.
type hierGroups struct {
	sizes []int
	// first[k] is the rank of group k's first member; first[G] = W.
	first []int
	cols  int
	// group and pos are this peer's group and position in it.
	group, pos int
}

func newHierGroups(sizes []int, rank int) *hierGroups {
	h := &hierGroups{sizes: sizes, first: make([]int, len(sizes)+1)}
	for k, g := range sizes {
		h.first[k+1] = h.first[k] + g
		h.cols = max(h.cols, g)
		if rank >= h.first[k] && rank < h.first[k+1] {
			h.group, h.pos = k, rank-h.first[k]
		}
	}
	return h
}

// colsOf returns the columns [a, b) that member j of group k owns.
func (h *hierGroups) colsOf(k, j int) (int, int) {
	g := h.sizes[k]
	return j * h.cols / g, (j + 1) * h.cols / g
}

// owner returns the rank of the member of group k that owns column c.
func (h *hierGroups) owner(k, c int) int {
	j := 0
	for ; j < h.sizes[k]-1; j++ {
		if _, b := h.colsOf(k, j); c < b {
			break
		}
	}
	return h.first[k] + j
}

// span returns the chunk range of columns [a, b) in l.
func (h *hierGroups) span(l *layout, a, b int) [2]int {
	n := len(h.sizes)
	return [2]int{l.segFirst[a*n], l.segFirst[b*n]}
}

// crossLanes is the number of column rings a member of a small group runs
// at once in the cross-group level: column c's frames carry sub-round
// 2 + c mod crossLanes (sub-rounds have 4 bits; the group level uses 0 and
// 1), and a member runs the columns of one lane one after another in
// ascending order, so two rings between the same pair of peers never share
// a lane at once.
const crossLanes = 14

// groupPass is the ring of this peer's group: ring segment i holds the
// columns of member i−1, so that the reduce-scatter leaves each member with
// the sums of its own columns. Reduce frames carry sub-round 0, the final
// all-gather's sub-round 1.
func (h *hierGroups) groupPass(l *layout) *ringPass {
	k, g := h.group, h.sizes[h.group]
	p := &ringPass{me: h.pos, rs: subPhase(PhaseReduce, 0), ag: subPhase(PhaseGather, 1)}
	for j := 0; j < g; j++ {
		p.ranks = append(p.ranks, h.first[k]+j)
		a, b := h.colsOf(k, (j+g-1)%g)
		p.segs = append(p.segs, h.span(l, a, b))
	}
	return p
}

// crossPass is the ring of column c's owners, one per group in group order,
// with one segment per group (sub-round 2 + c mod crossLanes; hop numbers
// after the group's).
func (h *hierGroups) crossPass(l *layout, c int) *ringPass {
	n := len(h.sizes)
	sub := 2 + c%crossLanes
	p := &ringPass{me: h.group, rs: subPhase(PhaseReduce, sub), ag: subPhase(PhaseGather, sub), hop0: h.cols}
	for k := 0; k < n; k++ {
		p.ranks = append(p.ranks, h.owner(k, c))
		s := c*n + k
		p.segs = append(p.segs, [2]int{l.segFirst[s], l.segFirst[s+1]})
	}
	return p
}

// hierReduce is the hierarchical all-reduce of a linear codec's bucket
// (ScheduleHierarchical):
//
//  1. reduce-scatter inside the group: each member ends with its columns
//     summed over the group, kept in fp32 (partial);
//  2. for each column it owns, a ring all-reduce of partial among the
//     column's owners in every group: the last reduce-scatter hop divides
//     by W and encodes the final bytes, which the ring's all-gather passes
//     on unchanged (a member of a small group owns several columns and
//     runs up to crossLanes of their rings at once);
//  3. all-gather inside the group of those final bytes.
//
// Every peer decodes the same final bytes of every chunk, so all hold the
// same bits. The ops' data is this peer's gradient and their output the
// bucket's result.
func hierReduce(o *op, h *hierGroups, n int, ops *codecOps) error {
	s := o.s
	l := makeLayout(n, h.cols*len(h.sizes), 1, s.chunkElems(), minChunkElems, nil)
	partial := s.floats.get(n)
	defer s.floats.put(partial)
	finals := make([][]byte, len(l.chunks))
	keep := func(i int, payload []byte) { finals[i] = payload }

	grp := h.groupPass(&l)
	ca, cb := h.colsOf(h.group, h.pos)
	o.begin(grp.received())

	// 1. Group reduce-scatter into partial.
	own := h.span(&l, ca, cb)
	if len(grp.ranks) == 1 {
		for i := own[0]; i < own[1]; i++ {
			c := l.chunks[i]
			copy(partial[c.off:c.off+c.n], ops.data[c.off:c.off+c.n])
		}
	} else if err := ringScatter(o, grp, &l, ops, func(i int, c chunk, recv []byte) error {
		if err := ops.absorb(partial[c.off:c.off+c.n], c, recv); err != nil {
			return o.opFail(grp.prev(), err)
		}
		return nil
	}); err != nil {
		return err
	}

	// 2. Cross-group all-reduce of each owned column, a lane at a time.
	lanes := make([][]int, min(cb-ca, crossLanes))
	for c := ca; c < cb; c++ {
		lanes[c%len(lanes)] = append(lanes[c%len(lanes)], c)
	}
	errs := make([]error, len(lanes))
	var wg sync.WaitGroup
	for k, cols := range lanes {
		run := func() {
			// Each lane has its own op (progress counters) and scratch.
			lo := *o
			sum := &codecOps{bucketCtx: &bucketCtx{step: ops.step, w: ops.w, rank: ops.rank, data: partial, out: ops.out, codec: ops.codec, pool: ops.pool}}
			defer sum.release()
			for _, c := range cols {
				if errs[k] = crossColumn(&lo, h, &l, c, sum, keep); errs[k] != nil {
					return
				}
			}
		}
		if len(lanes) == 1 {
			run()
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}

	// 3. Group all-gather of the final bytes.
	if len(grp.ranks) == 1 {
		return nil
	}
	for i := own[0]; i < own[1]; i++ {
		f := append(o.newFrame(len(finals[i])), finals[i]...)
		if err := o.seal(f, grp.ag, i); err != nil {
			return err
		}
		s.send(grp.next(), f)
	}
	return ringGather(o, grp, &l, ops, nil)
}

// crossColumn runs the cross-group all-reduce of column c of partial (the
// data of sum), decoding the result into sum's output and handing keep
// every chunk's final bytes.
func crossColumn(o *op, h *hierGroups, l *layout, c int, sum *codecOps, keep func(int, []byte)) error {
	x := h.crossPass(l, c)
	if len(x.ranks) > 1 {
		o.begin(x.received())
		if err := ringScatter(o, x, l, sum, x.finalHop(o, l, sum, keep)); err != nil {
			return err
		}
		return ringGather(o, x, l, sum, keep)
	}
	// One group: this member alone holds the column's sums.
	span := h.span(l, c, c+1)
	for i := span[0]; i < span[1]; i++ {
		ch := l.chunks[i]
		t := sum.scratch(ch.n)
		copy(t, sum.data[ch.off:ch.off+ch.n])
		divide(t, sum.w)
		f, err := sum.codec.Encode(o.newFrame(sum.maxLen(ch.n)), t, sum.pos(ch, uint32(x.hop0), false))
		if err != nil {
			return o.opFail(-1, err)
		}
		keep(i, f[HeaderSize:])
		if err := sum.finish(ch, f[HeaderSize:]); err != nil {
			return o.opFail(-1, err)
		}
	}
	return nil
}
