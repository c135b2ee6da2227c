package sgemm

// kernelGo is the pure-Go micro-kernel (see kernelFunc). It walks the mr×nr
// tile in 2×4 sub-tiles held in registers; each product is rounded to float32
// before it is added (the explicit conversion stops the compiler fusing it
// into an FMA), so its results do not depend on GOAMD64.
func kernelGo(kc int, a, b, c []float32, ldc int, alpha, beta float32, load bool) {
	a = a[:kc*mr]
	b = b[:kc*nr]
	for i := 0; i < mr; i += 2 {
		for j := 0; j < nr; j += 4 {
			var c00, c01, c02, c03, c10, c11, c12, c13 float32
			ia, ib := i, j
			for p := 0; p < kc; p++ {
				ap := a[ia : ia+2]
				bp := b[ib : ib+4]
				a0, a1 := ap[0], ap[1]
				b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
				c00 += float32(a0 * b0)
				c01 += float32(a0 * b1)
				c02 += float32(a0 * b2)
				c03 += float32(a0 * b3)
				c10 += float32(a1 * b0)
				c11 += float32(a1 * b1)
				c12 += float32(a1 * b2)
				c13 += float32(a1 * b3)
				ia += mr
				ib += nr
			}
			r0 := c[i*ldc+j:][:4]
			r1 := c[(i+1)*ldc+j:][:4]
			if load {
				r0[0] = float32(alpha*c00) + float32(beta*r0[0])
				r0[1] = float32(alpha*c01) + float32(beta*r0[1])
				r0[2] = float32(alpha*c02) + float32(beta*r0[2])
				r0[3] = float32(alpha*c03) + float32(beta*r0[3])
				r1[0] = float32(alpha*c10) + float32(beta*r1[0])
				r1[1] = float32(alpha*c11) + float32(beta*r1[1])
				r1[2] = float32(alpha*c12) + float32(beta*r1[2])
				r1[3] = float32(alpha*c13) + float32(beta*r1[3])
			} else {
				r0[0], r0[1], r0[2], r0[3] = alpha*c00, alpha*c01, alpha*c02, alpha*c03
				r1[0], r1[1], r1[2], r1[3] = alpha*c10, alpha*c11, alpha*c12, alpha*c13
			}
		}
	}
}
