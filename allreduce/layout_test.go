package allreduce

import "testing"

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
		l := makeLayout(tc.n, tc.w, tc.g, tc.c, tc.shares)
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
