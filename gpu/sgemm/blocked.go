package sgemm

import (
	"runtime"
	"sync"
)

// Blocking parameters. A micro-panel of B (kcBlock×nr, 16 KiB) stays in L1
// while the packed mcBlock×kcBlock block of A (120 KiB) sits in L2 and the
// packed kcBlock×ncBlock block of B in L3.
const (
	mr      = 6    // rows of the register tile
	nr      = 16   // columns of the register tile
	kcBlock = 256  // depth of a packed block
	mcBlock = 120  // rows of a packed A block, a multiple of mr
	ncBlock = 4096 // columns of a packed B block, a multiple of nr

	// smallWork is the m·n·k below which packing costs more than it saves.
	smallWork = 4 * 4 * 4

	// minThreadWork is the least m·n·k worth a goroutine of its own.
	minThreadWork = 96 * 96 * 96
)

// maxProcs is the most goroutines one call uses; tests replace it.
var maxProcs = func() int { return runtime.GOMAXPROCS(0) }

// kernelFunc multiplies one packed mr×kc panel of A by one packed kc×nr panel
// of B and adds the product into the mr×nr tile of C at c[0], row stride ldc:
//
//	for i < mr: for j < nr: s := 0; for p < kc: s += a[p*mr+i]*b[p*nr+j]
//	        C[i][j] = float32(alpha*s) + float32(beta*C[i][j])   (load)
//	        C[i][j] = alpha*s                                     (!load)
//
// kc is at least 1 and the whole tile lies inside c.
type kernelFunc func(kc int, a, b, c []float32, ldc int, alpha, beta float32, load bool)

// microKernel is the kernel in use; the amd64 init replaces it with the
// assembly kernel when the CPU has AVX2 and FMA, and tests swap it.
var microKernel kernelFunc = kernelGo

// workspace holds the packing buffers of one Sgemm call.
type workspace struct {
	a    []float32 // packed A block, mcBlock×kcBlock
	b    []float32 // packed B block, up to kcBlock×ncBlock
	tile [mr * nr]float32
}

var workspaces = sync.Pool{New: func() any { return new(workspace) }}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// work is m·n·k, as a float64 so that it cannot overflow.
func work(m, n, k int) float64 { return float64(m) * float64(n) * float64(k) }

// split returns the block size for a dimension of length n split into
// ceil(n/max) equal blocks rounded up to a multiple of unit, so that the last
// block is not a sliver.
func split(n, max, unit int) int {
	blocks := (n + max - 1) / max
	bs := (n + blocks - 1) / blocks
	return (bs + unit - 1) / unit * unit
}

// blocked is the packed, cache-blocked product for the checked arguments with
// m, n, k > 0. Large products are split into bands of rows (or of columns,
// when C is wider than tall), one goroutine each; every band runs the same
// arithmetic on its elements as a single band would, so results do not depend
// on the number of goroutines.
func blocked(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	kern := microKernel
	t := int(min(float64(maxProcs()), work(m, n, k)/minThreadWork))
	byRows := m >= n
	if byRows {
		t = min(t, (m+mr-1)/mr)
	} else {
		t = min(t, (n+nr-1)/nr)
	}
	if t <= 1 {
		rect(kern, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	var band int
	if byRows {
		band = ((m+t-1)/t + mr - 1) / mr * mr
	} else {
		band = ((n+t-1)/t + nr - 1) / nr * nr
	}
	var wg sync.WaitGroup
	for lo := 0; ; lo += band {
		if byRows {
			hi := min(lo+band, m)
			var ra []float32
			if transA {
				ra = a[lo:]
			} else {
				ra = a[lo*lda:]
			}
			rc := c[lo*ldc:]
			if hi == m {
				rect(kern, transA, transB, hi-lo, n, k, alpha, ra, lda, b, ldb, beta, rc, ldc)
				break
			}
			wg.Go(func() { rect(kern, transA, transB, hi-lo, n, k, alpha, ra, lda, b, ldb, beta, rc, ldc) })
		} else {
			hi := min(lo+band, n)
			var rb []float32
			if transB {
				rb = b[lo*ldb:]
			} else {
				rb = b[lo:]
			}
			rc := c[lo:]
			if hi == n {
				rect(kern, transA, transB, m, hi-lo, k, alpha, a, lda, rb, ldb, beta, rc, ldc)
				break
			}
			wg.Go(func() { rect(kern, transA, transB, m, hi-lo, k, alpha, a, lda, rb, ldb, beta, rc, ldc) })
		}
	}
	wg.Wait()
}

// rect is the single-goroutine blocked product: the jc, pc and ic loops of
// GotoBLAS around macro.
func rect(kern kernelFunc, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ws := workspaces.Get().(*workspace)
	defer workspaces.Put(ws)

	kcb := split(k, kcBlock, 1)
	ncb := split(n, ncBlock, nr)
	mcb := split(m, mcBlock, mr)
	ws.a = grow(ws.a, mcb*kcb)
	ws.b = grow(ws.b, ncb*kcb)

	for jc := 0; jc < n; jc += ncb {
		nc := min(ncb, n-jc)
		for pc := 0; pc < k; pc += kcb {
			kc := min(kcb, k-pc)
			packB(transB, b, ldb, pc, jc, kc, nc, ws.b)
			bet, load := beta, beta != 0
			if pc > 0 {
				bet, load = 1, true
			}
			for ic := 0; ic < m; ic += mcb {
				mc := min(mcb, m-ic)
				packA(transA, a, lda, ic, pc, mc, kc, ws.a)
				macro(kern, mc, nc, kc, alpha, ws.a, ws.b, bet, load, c[ic*ldc+jc:], ldc, &ws.tile)
			}
		}
	}
}

// macro multiplies a packed mc×kc block of A by a packed kc×nc block of B into
// the mc×nc block of C at c[0].
func macro(kern kernelFunc, mc, nc, kc int, alpha float32, pa, pb []float32, beta float32, load bool, c []float32, ldc int, tile *[mr * nr]float32) {
	for jr := 0; jr < nc; jr += nr {
		bp := pb[jr*kc : (jr+nr)*kc]
		cols := min(nr, nc-jr)
		for ir := 0; ir < mc; ir += mr {
			ap := pa[ir*kc : (ir+mr)*kc]
			rows := min(mr, mc-ir)
			if rows == mr && cols == nr {
				kern(kc, ap, bp, c[ir*ldc+jr:], ldc, alpha, beta, load)
				continue
			}
			// Edge tile: compute the full tile into scratch (alpha*s with
			// alpha = 1 is exact), then update the part inside C with the
			// same rounding as the kernel.
			kern(kc, ap, bp, tile[:], nr, 1, 0, false)
			for i := 0; i < rows; i++ {
				src := tile[i*nr : i*nr+cols]
				dst := c[(ir+i)*ldc+jr:][:cols]
				if load {
					for j, s := range src {
						dst[j] = float32(alpha*s) + float32(beta*dst[j])
					}
				} else {
					for j, s := range src {
						dst[j] = alpha * s
					}
				}
			}
		}
	}
}

// packA copies rows i0..i0+mc, columns p0..p0+kc of op(A) into dst as mr-row
// panels: dst[ir*kc + p*mr + r] = opA[i0+ir+r][p0+p], zero-padding the last panel.
func packA(trans bool, a []float32, lda, i0, p0, mc, kc int, dst []float32) {
	for ir := 0; ir < mc; ir += mr {
		d := dst[ir*kc : (ir+mr)*kc]
		rows := min(mr, mc-ir)
		if trans {
			// opA[i][p] = a[p*lda+i]: each p is a contiguous run of rows.
			off := p0*lda + i0 + ir
			if rows == mr && packCopyA(d, a[off:], lda, kc) {
				continue
			}
			if rows == mr {
				for p := 0; p < kc; p++ {
					*(*[mr]float32)(d[p*mr:]) = [mr]float32(a[off:])
					off += lda
				}
				continue
			}
			for p := 0; p < kc; p++ {
				dp := d[p*mr : p*mr+mr]
				copy(dp, a[off:][:rows])
				clear(dp[rows:])
				off += lda
			}
			continue
		}
		base := (i0+ir)*lda + p0
		if rows == mr {
			done := packTransposeA(d, a[base:], lda, kc)
			s0 := a[base:][:kc]
			s1 := a[base+lda:][:kc]
			s2 := a[base+2*lda:][:kc]
			s3 := a[base+3*lda:][:kc]
			s4 := a[base+4*lda:][:kc]
			s5 := a[base+5*lda:][:kc]
			for p := done; p < kc; p++ {
				dp := d[p*mr : p*mr+mr]
				dp[0], dp[1], dp[2], dp[3], dp[4], dp[5] = s0[p], s1[p], s2[p], s3[p], s4[p], s5[p]
			}
			continue
		}
		clear(d)
		for r := 0; r < rows; r++ {
			for p, v := range a[base+r*lda:][:kc] {
				d[p*mr+r] = v
			}
		}
	}
}

// packB copies rows p0..p0+kc, columns j0..j0+nc of op(B) into dst as nr-column
// panels: dst[jr*kc + p*nr + c] = opB[p0+p][j0+jr+c], zero-padding the last panel.
func packB(trans bool, b []float32, ldb, p0, j0, kc, nc int, dst []float32) {
	for jr := 0; jr < nc; jr += nr {
		d := dst[jr*kc : (jr+nr)*kc]
		cols := min(nr, nc-jr)
		if !trans {
			off := p0*ldb + j0 + jr
			if cols == nr && packCopyB(d, b[off:], ldb, kc) {
				continue
			}
			if cols == nr {
				for p := 0; p < kc; p++ {
					*(*[nr]float32)(d[p*nr:]) = [nr]float32(b[off:])
					off += ldb
				}
				continue
			}
			for p := 0; p < kc; p++ {
				dp := d[p*nr : p*nr+nr]
				copy(dp, b[off:][:cols])
				clear(dp[cols:])
				off += ldb
			}
			continue
		}
		// opB[p][j] = b[j*ldb+p]: each column of op(B) is a contiguous row of b.
		base := (j0+jr)*ldb + p0
		done := 0
		if cols == nr {
			done = packTransposeB(d, b[base:], ldb, kc)
		} else {
			clear(d)
		}
		for col := 0; col < cols; col++ {
			src := b[base+col*ldb:][:kc]
			for p := done; p < kc; p++ {
				d[p*nr+col] = src[p]
			}
		}
	}
}
