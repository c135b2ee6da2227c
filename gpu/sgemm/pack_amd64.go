//go:build amd64 && !purego

package sgemm

// transpose6 writes dst[p*6+r] = src[r*ld+p] for r < 6, p < 8·blocks
// (AVX2; blocks ≥ 1).
//
//go:noescape
func transpose6(dst, src *float32, ld, blocks int)

// transpose16 writes dst[p*16+c] = src[c*ld+p] for c < 16, p < 8·blocks
// (AVX2; blocks ≥ 1).
//
//go:noescape
func transpose16(dst, src *float32, ld, blocks int)

// packTransposeA packs the first 8·(kc/8) columns of the 6 rows of s0 (row
// stride ld) into d with AVX2 and returns how many it packed.
func packTransposeA(d, s0 []float32, ld, kc int) int {
	blocks := kc / 8
	if !asmPack || blocks == 0 {
		return 0
	}
	_ = d[blocks*8*mr-1]
	_ = s0[(mr-1)*ld+blocks*8-1]
	transpose6(&d[0], &s0[0], ld, blocks)
	return blocks * 8
}

// packTransposeB packs the first 8·(kc/8) elements of the 16 rows of s0 (row
// stride ld) into d with AVX2 and returns how many it packed.
func packTransposeB(d, s0 []float32, ld, kc int) int {
	blocks := kc / 8
	if !asmPack || blocks == 0 {
		return 0
	}
	_ = d[blocks*8*nr-1]
	_ = s0[(nr-1)*ld+blocks*8-1]
	transpose16(&d[0], &s0[0], ld, blocks)
	return blocks * 8
}

// copy6 writes dst[p*6+r] = src[p*ld+r] for r < 6, p < n (AVX; n ≥ 1).
//
//go:noescape
func copy6(dst, src *float32, ld, n int)

// copy16 writes dst[p*16+c] = src[p*ld+c] for c < 16, p < n (AVX; n ≥ 1).
//
//go:noescape
func copy16(dst, src *float32, ld, n int)

// packCopyA packs kc runs of 6 elements, ld apart in s0, into d with AVX and
// reports whether it did.
func packCopyA(d, s0 []float32, ld, kc int) bool {
	if !asmPack {
		return false
	}
	_ = d[kc*mr-1]
	_ = s0[(kc-1)*ld+mr-1]
	copy6(&d[0], &s0[0], ld, kc)
	return true
}

// packCopyB packs kc runs of 16 elements, ld apart in s0, into d with AVX and
// reports whether it did.
func packCopyB(d, s0 []float32, ld, kc int) bool {
	if !asmPack {
		return false
	}
	_ = d[kc*nr-1]
	_ = s0[(kc-1)*ld+nr-1]
	copy16(&d[0], &s0[0], ld, kc)
	return true
}
