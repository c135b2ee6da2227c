package allreduce

import (
	"testing"

	"github.com/p2ptrain/p2ptrain/compress"
)

// TestLayoutCovers checks that segments and chunks tile the buffer exactly,
// respect the granule and follow shares.
func TestLayoutCovers(t *testing.T) {
	for _, tc := range []struct {
		n, w, g, c int
		shares     []float64
	}{
		{0, 1, 1, 4, nil}, {1, 3, 1, 4, nil}, {2, 8, 1, 1, nil}, {1000, 7, 1, 33, nil},
		{5000, 4, 512, 1000, nil}, {4097, 3, 2048, 8192, nil},
		{1000, 4, 1, 64, []float64{0, 1.0 / 3, 1.0 / 3, 1.0 / 3}},
		{999, 3, 10, 64, []float64{0.5, 0.5, 0}},
	} {
		l := makeLayout(tc.n, tc.w, tc.g, tc.c, minChunkElems, tc.shares)
		next := 0
		for s := 0; s < tc.w; s++ {
			if l.segStart[s] != next {
				t.Fatalf("%+v: segment %d starts at %d, want %d", tc, s, l.segStart[s], next)
			}
			if l.segStart[s]%tc.g != 0 && l.segStart[s] != tc.n {
				t.Fatalf("%+v: segment %d start %d not aligned", tc, s, l.segStart[s])
			}
			a, b := l.seg(s)
			for c := a; c < b; c++ {
				ch := l.chunks[c]
				if ch.off != next || ch.n <= 0 || ch.seg != s || ch.off%tc.g != 0 {
					t.Fatalf("%+v: bad chunk %d %+v (next %d)", tc, c, ch, next)
				}
				next += ch.n
			}
			if next != l.segStart[s+1] {
				t.Fatalf("%+v: segment %d chunks end at %d, want %d", tc, s, next, l.segStart[s+1])
			}
			if tc.shares != nil && tc.shares[s] == 0 && b != a {
				t.Fatalf("%+v: zero share segment %d has chunks", tc, s)
			}
		}
		if next != tc.n {
			t.Fatalf("%+v: covered %d of %d", tc, next, tc.n)
		}
	}
}

// TestLayoutPipelinesSmallSegments checks that a segment of one configured
// chunk or less is still cut into pipelineChunks chunks (so a ring hop
// forwards the first while the rest arrive), never below minChunkElems,
// that big segments keep the configured chunk, and that chunks stay
// multiples of the granule.
func TestLayoutPipelinesSmallSegments(t *testing.T) {
	for _, tc := range []struct {
		name              string
		n, w, g, c        int
		wantChunks, wantN int // per segment, and the first chunk's size
	}{
		{"1MiB on 4 peers at the default chunk", 1 << 18, 4, 1, 1 << 16, 8, 1 << 13},
		{"64MiB on 4 peers keeps the configured chunk", 1 << 24, 4, 1, 1 << 16, 64, 1 << 16},
		{"a segment of minChunkElems is one chunk", 4 * minChunkElems, 4, 1, 1 << 16, 1, minChunkElems},
		{"the granule rounds the chunk up", 1 << 18, 4, 2048, 1 << 16, 8, 1 << 13},
		{"an odd granule", 1 << 18, 4, 3000, 1 << 16, 8, 9000},
	} {
		l := makeLayout(tc.n, tc.w, tc.g, tc.c, minChunkElems, nil)
		a, b := l.seg(0)
		if b-a != tc.wantChunks || l.chunks[a].n != tc.wantN {
			t.Errorf("%s: segment 0 has %d chunks, the first of %d values; want %d of %d", tc.name, b-a, l.chunks[a].n, tc.wantChunks, tc.wantN)
		}
		for _, ch := range l.chunks {
			if ch.off%tc.g != 0 {
				t.Errorf("%s: chunk at %d is not aligned to the granule %d", tc.name, ch.off, tc.g)
			}
		}
	}
}

// TestWireScale checks that a compressing codec's chunks hold as many more
// values as it compresses, so its frames stay near the configured chunk's
// fp32 bytes, and that the scale is bounded.
func TestWireScale(t *testing.T) {
	const chunk = 1 << 16 // the default 256 KiB
	for _, tc := range []struct {
		spec string
		want int
	}{
		{"none", 1}, {"fp16", 2}, {"bf16", 2}, {"int8", 4}, {"sint8", 4}, {"dyn8", 4},
		{"qsgd:bits=4", 8}, {"onebit", 31}, {"sign", 32},
	} {
		c, err := compress.New(tc.spec, compress.Options{Layout: compress.FlatLayout(1 << 20), Seed: 1})
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		got := wireScale(c, chunk)
		if got != tc.want {
			t.Errorf("%s: wireScale %d, want %d", tc.spec, got, tc.want)
		}
		if enc := c.MaxEncodedLen(got * chunk); enc > 4*chunk*105/100 {
			t.Errorf("%s: a scaled chunk encodes to %d bytes, more than 5%% over the fp32 chunk's %d", tc.spec, enc, 4*chunk)
		}
	}
}
