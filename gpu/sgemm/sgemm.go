// Package sgemm is p2ptrain's single-precision matrix multiply for the CPU device.
//
// Sgemm checks its arguments and then runs a GotoBLAS/BLIS-style blocked
// algorithm: op(A) and op(B) are packed, a cache block at a time, into
// contiguous panels (which is where transposes are handled), and a register-tiled
// 6×16 micro-kernel multiplies one A panel by one B panel. On amd64 CPUs with
// AVX2 and FMA the micro-kernel and the packing transposes are assembly
// (kernel_amd64.s, pack_amd64.s); elsewhere, or when built with the purego
// tag, pure-Go twins run instead, and the tests run both. Tiny products
// (m·n·k ≤ 64) skip packing and use the plain reference loop. Large products
// are split into bands of C rows or columns, one goroutine each, up to
// GOMAXPROCS.
//
// # Rounding and determinism
//
// Results match the reference loop up to rounding, not bit for bit: each C
// element's dot product is summed over k in increasing order, but in blocks of
// at most kcBlock terms, and each block is added into C as
// float32(alpha·s) + float32(beta·C) (beta applied by the first block only,
// later blocks use beta = 1). The assembly kernel fuses each multiply-add (FMA),
// the pure-Go kernel rounds the product first, so the two kernels may differ in
// the last bits. For a given kernel the output bits depend only on the inputs
// and the shape: not on the run, the machine, the memory layout or the number of
// goroutines used, since work is only ever split across rows and columns of C,
// never along k.
//
// When beta is 0, C is not read, so NaN or Inf already in C does not propagate.
package sgemm

import "fmt"

// Sgemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices, where
// op(X) is X or Xᵀ as transA/transB say, op(A) is m×k, op(B) is k×n and C is m×n.
// lda, ldb and ldc are the row strides of A, B and C as stored.
//
// Reference loop (what every optimised kernel must match up to rounding):
//
//	for i < m: for j < n: s := 0; for l < k: s += opA[i][l]*opB[l][j]; C[i][j] = alpha*s + beta*C[i][j]
//
// It panics with a "sgemm:" message when a dimension or slice length is inconsistent.
// Large products are shared out among up to GOMAXPROCS goroutines, which
// Sgemm waits for; the result bits do not depend on how many run. Sgemm is
// safe for concurrent use on distinct C matrices. Steady-state calls that run
// on one goroutine do not allocate.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	check(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || work(m, n, k) <= smallWork {
		reference(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	blocked(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

func check(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("sgemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	need := func(name string, s []float32, rows, cols, ld int) {
		if rows == 0 || cols == 0 {
			return
		}
		if ld < cols {
			panic(fmt.Sprintf("sgemm: %s stride %d < %d columns", name, ld, cols))
		}
		if len(s) < (rows-1)*ld+cols {
			panic(fmt.Sprintf("sgemm: %s has %d elements, need %d", name, len(s), (rows-1)*ld+cols))
		}
	}
	need("a", a, ar, ac, lda)
	need("b", b, br, bc, ldb)
	need("c", c, m, n, ldc)
}

// reference is the plain triple loop.
func reference(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for l := 0; l < k; l++ {
				var x, y float32
				if transA {
					x = a[l*lda+i]
				} else {
					x = a[i*lda+l]
				}
				if transB {
					y = b[j*ldb+l]
				} else {
					y = b[l*ldb+j]
				}
				s += float32(x * y)
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * s
			} else {
				c[i*ldc+j] = float32(alpha*s) + float32(beta*c[i*ldc+j])
			}
		}
	}
}
