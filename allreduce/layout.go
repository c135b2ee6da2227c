package allreduce

import "math"

// chunk is one pipeline unit of a bucket: elements [off, off+n) of segment seg.
type chunk struct {
	seg, off, n int
}

// layout cuts a buffer of n values into W segments and each segment into
// pipeline chunks. Segment boundaries and chunk sizes are multiples of the
// granule (the codec's scale bucket) except at the end of the buffer.
type layout struct {
	n        int
	segStart []int // W+1 element offsets
	segFirst []int // W+1 chunk indices
	chunks   []chunk
}

// Pipeline depth of small segments. A ring hop forwards a chunk only once
// it has all of it, so a segment of one chunk is store-and-forward: every
// hop of the ring costs a whole segment's transfer plus its latency, one
// after the other (a 1 MiB bucket on 4 peers at the 256 KiB default chunk
// is exactly that). makeLayout therefore cuts a segment into at least
// pipelineChunks chunks, none smaller than minChunkElems values (16 KiB of
// fp32: per-frame costs stay small next to the payload), and none larger
// than the configured chunk.
const (
	pipelineChunks = 8
	minChunkElems  = 4096
)

// segChunk returns the chunk size for a segment of segLen values: the
// configured chunkElems, or less, so that the segment has pipelineChunks
// chunks when they can stay at or above minChunkElems; a multiple of
// granule either way.
func segChunk(segLen, granule, chunkElems int) int {
	c := (segLen + pipelineChunks - 1) / pipelineChunks
	c = max(c, minChunkElems)
	c = (c + granule - 1) / granule * granule
	return min(c, chunkElems)
}

// makeLayout builds the layout. shares (nil: equal) gives each segment's
// fraction of the buffer. Every peer computes the same layout from the same
// arguments (frames name chunks by index).
func makeLayout(n, w, granule, chunkElems int, shares []float64) layout {
	if granule < 1 {
		granule = 1
	}
	if chunkElems < granule {
		chunkElems = granule
	}
	chunkElems -= chunkElems % granule
	g := (n + granule - 1) / granule
	l := layout{n: n, segStart: make([]int, w+1), segFirst: make([]int, w+1)}
	cum := 0.0
	for s := 0; s <= w; s++ {
		var b int
		switch {
		case s == w:
			b = g
		case shares == nil:
			b = s * g / w
		default:
			b = int(math.Round(cum * float64(g)))
			cum += shares[s]
		}
		if b > g {
			b = g
		}
		if s > 0 && b < l.segStart[s-1]/granule {
			b = l.segStart[s-1] / granule
		}
		e := b * granule
		if e > n {
			e = n
		}
		l.segStart[s] = e
	}
	for s := 0; s < w; s++ {
		l.segFirst[s] = len(l.chunks)
		ce := segChunk(l.segStart[s+1]-l.segStart[s], granule, chunkElems)
		for off := l.segStart[s]; off < l.segStart[s+1]; off += ce {
			m := ce
			if off+m > l.segStart[s+1] {
				m = l.segStart[s+1] - off
			}
			l.chunks = append(l.chunks, chunk{seg: s, off: off, n: m})
		}
	}
	l.segFirst[w] = len(l.chunks)
	return l
}

// seg returns the chunk indices [first, end) of segment s.
func (l *layout) seg(s int) (int, int) { return l.segFirst[s], l.segFirst[s+1] }
