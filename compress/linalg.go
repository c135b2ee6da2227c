package compress

import "math"

// Dense kernels of the low-rank codecs. Matrices are row-major; A is n×m, the
// factors are n×r and m×r. Every sum runs in a fixed order and every product is
// converted to float32 explicitly so no compiler fuses a multiply-add: the same
// inputs give the same bits on every machine.

// prepMul sets mp = g + e (e may be nil: mp = g) and p = mp·q.
func prepMul(p, mp, g, e, q []float32, n, m, r int) {
	i := 0
	if r == 4 {
		for ; i+2 <= n; i += 2 {
			prepMul4x2(p[4*i:4*i+8], mp[i*m:i*m+2*m], g[i*m:i*m+2*m], rowsOf(e, i, 2, m), q, m)
		}
	}
	for ; i < n; i++ {
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
		acc := p[i*r : i*r+r]
		clear(acc)
		for k, x := range row {
			qk := q[k*r : k*r+r]
			for j := range acc {
				acc[j] += float32(x * qk[j])
			}
		}
	}
}

// rowsOf returns rows i…i+c−1 of an n×m matrix, or nil for a nil matrix.
func rowsOf(a []float32, i, c, m int) []float32 {
	if a == nil {
		return nil
	}
	return a[i*m : (i+c)*m]
}

// prepMul4x2 is prepMul for two rows and r = 4 (same sums, same order).
func prepMul4x2(p, mp, g, e, q []float32, m int) {
	r0, r1 := mp[:m], mp[m:2*m]
	g0, g1 := g[:m], g[m:2*m]
	var e0, e1 []float32
	if e != nil {
		e0, e1 = e[:m], e[m:2*m]
	}
	q = q[:4*m]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	k0 := 0
	if n := m &^ 7; useAVX2 && n > 0 {
		var acc [8]float32
		var ep0, ep1 *float32
		if e0 != nil {
			ep0, ep1 = &e0[0], &e1[0]
		}
		prepMul4x2AVX2(&acc, &r0[0], &r1[0], &g0[0], &g1[0], ep0, ep1, &q[0], n)
		a0, a1, a2, a3, b0, b1, b2, b3 = acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]
		k0 = n
	}
	for k := k0; k < m; k++ {
		x, y := g0[k], g1[k]
		if e0 != nil {
			x += e0[k]
			y += e1[k]
		}
		r0[k], r1[k] = x, y
		qk := q[4*k : 4*k+4 : 4*k+4]
		q0, q1, q2, q3 := qk[0], qk[1], qk[2], qk[3]
		a0 += float32(x * q0)
		a1 += float32(x * q1)
		a2 += float32(x * q2)
		a3 += float32(x * q3)
		b0 += float32(y * q0)
		b1 += float32(y * q1)
		b2 += float32(y * q2)
		b3 += float32(y * q3)
	}
	p = p[:8]
	p[0], p[1], p[2], p[3] = a0, a1, a2, a3
	p[4], p[5], p[6], p[7] = b0, b1, b2, b3
}

// mulT sets out = aᵀ·p for a n×m and p n×r (out m×r). Rows are added in
// pairs for r = 4: out += (x_i·p_i + x_{i+1}·p_{i+1}).
func mulT(out, a, p []float32, n, m, r int) {
	out = out[:m*r]
	clear(out)
	i := 0
	if r == 4 {
		for ; i+2 <= n; i += 2 {
			r0, r1 := a[i*m:i*m+m], a[i*m+m:i*m+2*m]
			pi := p[4*i : 4*i+8]
			p0, p1, p2, p3 := pi[0], pi[1], pi[2], pi[3]
			s0, s1, s2, s3 := pi[4], pi[5], pi[6], pi[7]
			for k, x := range r0 {
				y := r1[k]
				o := out[4*k : 4*k+4 : 4*k+4]
				o[0] += float32(x*p0) + float32(y*s0)
				o[1] += float32(x*p1) + float32(y*s1)
				o[2] += float32(x*p2) + float32(y*s2)
				o[3] += float32(x*p3) + float32(y*s3)
			}
		}
	}
	for ; i < n; i++ {
		row := a[i*m : i*m+m]
		pi := p[i*r : i*r+r]
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
	outerRows(mp, a, b, n, m, r, 1, -1)
}

// outer sets out = (a·bᵀ)·scale for a n×r and b m×r.
func outer(out, a, b []float32, n, m, r int, scale float32) {
	outerRows(out, a, b, n, m, r, scale, 0)
}

// outerRows sets out = (a·bᵀ)·scale (mode 0) or out −= a·bᵀ (mode −1), the
// inner sums running over j in order.
func outerRows(out, a, b []float32, n, m, r int, scale float32, mode int) {
	i := 0
	if r == 4 {
		b = b[:4*m]
		for ; i+2 <= n; i += 2 {
			r0, r1 := out[i*m:i*m+m], out[i*m+m:i*m+2*m]
			ai := a[4*i : 4*i+8]
			a0, a1, a2, a3 := ai[0], ai[1], ai[2], ai[3]
			c0, c1, c2, c3 := ai[4], ai[5], ai[6], ai[7]
			for k := range r0 {
				bk := b[4*k : 4*k+4 : 4*k+4]
				b0, b1, b2, b3 := bk[0], bk[1], bk[2], bk[3]
				x := float32(a0*b0) + float32(a1*b1) + float32(a2*b2) + float32(a3*b3)
				y := float32(c0*b0) + float32(c1*b1) + float32(c2*b2) + float32(c3*b3)
				if mode == 0 {
					r0[k], r1[k] = x*scale, y*scale
				} else {
					r0[k] -= x
					r1[k] -= y
				}
			}
		}
	}
	for ; i < n; i++ {
		row := out[i*m : i*m+m]
		ai := a[i*r : i*r+r]
		for k := range row {
			x := dotR(ai, b[k*r:k*r+r])
			if mode == 0 {
				row[k] = x * scale
			} else {
				row[k] -= x
			}
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
