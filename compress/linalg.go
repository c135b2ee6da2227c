package compress

import "math"

// Dense kernels of the low-rank codecs. Matrices are row-major; A is n×m, the
// factors are n×r and m×r. Every sum runs in a fixed order and every product is
// converted to float32 explicitly so no compiler fuses a multiply-add: the same
// inputs give the same bits on every machine.

// prepMul sets mp = g + e (e may be nil: mp = g) and p = mp·q.
func prepMul(p, mp, g, e, q []float32, n, m, r int) {
	for i := range n {
		row := mp[i*m : i*m+m]
		gr := g[i*m : i*m+m]
		if e != nil {
			er := e[i*m : i*m+m]
			for k := range row {
				row[k] = gr[k] + er[k]
			}
		} else {
			copy(row, gr)
		}
		mulRow(p[i*r:i*r+r], row, q, r)
	}
}

// mulRow sets acc = row·q for one row of an n×m matrix and q m×r.
func mulRow(acc, row, q []float32, r int) {
	q = q[:len(row)*r]
	if r == 4 {
		var a0, a1, a2, a3 float32
		for k, x := range row {
			qk := q[4*k : 4*k+4 : 4*k+4]
			a0 += float32(x * qk[0])
			a1 += float32(x * qk[1])
			a2 += float32(x * qk[2])
			a3 += float32(x * qk[3])
		}
		acc[0], acc[1], acc[2], acc[3] = a0, a1, a2, a3
		return
	}
	clear(acc)
	for k, x := range row {
		qk := q[k*r : k*r+r]
		for j := range acc {
			acc[j] += float32(x * qk[j])
		}
	}
}

// mulT sets out = aᵀ·p for a n×m and p n×r (out m×r).
func mulT(out, a, p []float32, n, m, r int) {
	out = out[:m*r]
	clear(out)
	for i := range n {
		row := a[i*m : i*m+m]
		pi := p[i*r : i*r+r]
		if r == 4 {
			p0, p1, p2, p3 := pi[0], pi[1], pi[2], pi[3]
			for k, x := range row {
				o := out[4*k : 4*k+4 : 4*k+4]
				o[0] += float32(x * p0)
				o[1] += float32(x * p1)
				o[2] += float32(x * p2)
				o[3] += float32(x * p3)
			}
			continue
		}
		for k, x := range row {
			o := out[k*r : k*r+r]
			for j, pj := range pi {
				o[j] += float32(x * pj)
			}
		}
	}
}

// dotR returns Σ_j a[j]·b[j] over r terms, in order.
func dotR(a, b []float32) float32 {
	b = b[:len(a)]
	s := float32(a[0] * b[0])
	for j := 1; j < len(a); j++ {
		s += float32(a[j] * b[j])
	}
	return s
}

// subOuter sets mp -= a·bᵀ for a n×r and b m×r.
func subOuter(mp, a, b []float32, n, m, r int) {
	for i := range n {
		row := mp[i*m : i*m+m]
		ai := a[i*r : i*r+r]
		if r == 4 {
			a0, a1, a2, a3 := ai[0], ai[1], ai[2], ai[3]
			bb := b[:4*m]
			for k := range row {
				bk := bb[4*k : 4*k+4 : 4*k+4]
				row[k] -= float32(a0*bk[0]) + float32(a1*bk[1]) + float32(a2*bk[2]) + float32(a3*bk[3])
			}
			continue
		}
		for k := range row {
			row[k] -= dotR(ai, b[k*r:k*r+r])
		}
	}
}

// outer sets out = (a·bᵀ)·scale for a n×r and b m×r.
func outer(out, a, b []float32, n, m, r int, scale float32) {
	for i := range n {
		row := out[i*m : i*m+m]
		ai := a[i*r : i*r+r]
		if r == 4 {
			a0, a1, a2, a3 := ai[0], ai[1], ai[2], ai[3]
			bb := b[:4*m]
			for k := range row {
				bk := bb[4*k : 4*k+4 : 4*k+4]
				row[k] = (float32(a0*bk[0]) + float32(a1*bk[1]) + float32(a2*bk[2]) + float32(a3*bk[3])) * scale
			}
			continue
		}
		for k := range row {
			row[k] = dotR(ai, b[k*r:k*r+r]) * scale
		}
	}
}

// orthonormalize applies modified Gram–Schmidt to the r columns of a (n×r),
// dividing each column by its norm + 1e-8. Sums run in float64, in order.
func orthonormalize(a []float32, n, r int) {
	for j := range r {
		for c := range j {
			var dot float64
			for i := range n {
				dot += float64(float64(a[i*r+c]) * float64(a[i*r+j]))
			}
			for i := range n {
				a[i*r+j] = float32(float64(a[i*r+j]) - float64(dot*float64(a[i*r+c])))
			}
		}
		var ss float64
		for i := range n {
			x := float64(a[i*r+j])
			ss += float64(x * x)
		}
		inv := 1 / (math.Sqrt(ss) + 1e-8)
		for i := range n {
			a[i*r+j] = float32(float64(a[i*r+j]) * inv)
		}
	}
}

// allFinite reports whether every value of a is finite.
func allFinite(a []float32) bool {
	var m uint32
	for _, x := range a {
		m = max(m, absBits(x))
	}
	return m < 0x7f800000
}
