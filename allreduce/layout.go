package allreduce

import (
	"math"

	"github.com/p2ptrain/p2ptrain/compress"
)

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

// maxWireScale bounds wireScale: onebit's 32 values per fp32 word.
const maxWireScale = 32

// wireScale returns how many times more values than the configured chunk
// a chunk of codec c holds, so that its frames carry about as many bytes
// as an fp32 chunk would: 4·chunkElems / c.MaxEncodedLen(chunkElems)
// rounded, in [1, maxWireScale] (int8's scales make its ratio 3.99: 4). The configured chunk and minChunkElems count fp32
// bytes; without the scale a 4-bit codec's frames would be an eighth of
// that and a 1-bit codec's a thirty-second, and per-frame costs (a header,
// an encryption record, a write and a read, a wake-up) would dominate
// small buckets: 1 MiB of qsgd:bits=4 on 4 peers went out in 2 KiB frames.
// Every peer computes the same scale from the same codec spec.
func wireScale(c compress.Codec, chunkElems int) int {
	enc := c.MaxEncodedLen(chunkElems)
	if enc <= 0 {
		return 1
	}
	return min(max(int(math.Round(4*float64(chunkElems)/float64(enc))), 1), maxWireScale)
}

// chunkBounds returns the largest chunk and the smallest chunk a segment
// is cut into (segChunk) for a bucket of codec c under schedule sch, from
// the configured chunk of chunkElems values; perLink says the bucket has
// per-link codecs.
func chunkBounds(c compress.Codec, chunkElems int, sch Schedule, perLink bool) (chunk, minElems int) {
	chunk, minElems = chunkElems, minChunkElems
	if class := c.Class(); perLink || class == compress.ClassSparse || class == compress.ClassLowRank {
		// Per-link codecs would need one scale for every edge's codec, and
		// sparse and low-rank frames do not scale with the chunk's values.
		return chunk, minElems
	}
	f := wireScale(c, chunk)
	chunk *= f
	if sch != ScheduleRing {
		// The ring keeps its pipeline depth: a small bucket's segment
		// still crosses each hop in pipelineChunks chunks, at the cost of
		// smaller frames. The two-phase schedules gain little from depth
		// and much from fewer frames.
		minElems *= f
	}
	return chunk, minElems
}

// RingFrames returns the frames a peer sends in one flat-ring all-reduce
// of a bucket of n values under codec c among w peers, with the
// configured chunk of chunkBytes (0: DefaultChunkBytes): the chunks of
// the 2(w−1) segments it passes on, w−1 in each phase (an average over the
// peers when the segments' chunk counts differ); c nil counts fp32's
// chunks. Per-frame costs are priced with it (pipeline's projection).
func RingFrames(n, w int, c compress.Codec, chunkBytes int) float64 {
	if w <= 1 || n <= 0 {
		return 0
	}
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	chunk, minElems := max(chunkBytes/4, 1), minChunkElems
	if c != nil {
		chunk, minElems = chunkBounds(c, chunk, ScheduleRing, false)
	}
	l := makeLayout(n, w, 1, chunk, minElems, nil)
	return 2 * float64(w-1) / float64(w) * float64(len(l.chunks))
}

// segChunk returns the chunk size for a segment of segLen values: at most
// chunkElems, and less, so that the segment has pipelineChunks chunks,
// when they can stay at or above minElems (minChunkElems, times the codec's
// wireScale outside the ring); a multiple of granule either way.
func segChunk(segLen, granule, chunkElems, minElems int) int {
	c := (segLen + pipelineChunks - 1) / pipelineChunks
	c = max(c, minElems)
	c = (c + granule - 1) / granule * granule
	return min(c, chunkElems)
}

// makeLayout builds the layout. chunkElems and minElems bound its chunks
// (segChunk); shares (nil: equal) gives each segment's fraction of the
// buffer. Every peer computes the same layout from the same
// arguments (frames name chunks by index).
func makeLayout(n, w, granule, chunkElems, minElems int, shares []float64) layout {
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
		ce := segChunk(l.segStart[s+1]-l.segStart[s], granule, chunkElems, minElems)
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
