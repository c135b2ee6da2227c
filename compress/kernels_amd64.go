//go:build amd64 && !purego

package compress

import "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2 kernels of kernels_amd64.s. Each kernel computes
// exactly what its pure-Go twin (the loop it replaces, also built with the
// purego tag) computes, in the same order and with no fused multiply-add, so the
// bytes do not depend on the path. Tests switch it off to run the twins.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasPOPCNT

// absMaxBitsAVX2 returns max(bits(p[i]) & 0x7fffffff) for n a positive multiple of 32.
//
//go:noescape
func absMaxBitsAVX2(p *float32, n int) uint32

// sumAbsAVX2 adds |a[i]| (a = src, or a = src + r stored into r when r is not
// nil) into acc[i%4] in index order, for n a positive multiple of 4.
//
//go:noescape
func sumAbsAVX2(src, r *float32, n int, acc *[4]float64)

// packReconAVX2 writes out[j] bit k = (a[8j+k] >= 0) and sets
// r[i] = a[i] − (neg or pos, by the bit), for n a positive multiple of 8.
//
//go:noescape
func packReconAVX2(out *byte, a, r *float32, n int, neg, pos float32)

// oneBitStatsAVX2 runs oneBitHeader's loop over n values (a positive multiple
// of 8): x = g (+ r, stored into r); acc[i%8] += x and acc[8+i%8] += x when
// x >= 0 (as +0 for −0), in index order; it returns the number of x >= 0.
//
//go:noescape
func oneBitStatsAVX2(grad, r *float32, n int, acc *[16]float64) int

// quantStochAVX2 runs quantStochastic's groups of four over n values (a
// positive multiple of 8), c being the stream counter of the first group.
//
//go:noescape
func quantStochAVX2(out *byte, v *float32, n int, c uint64, scale float32, levels int32)

// prepMul4x2AVX2 runs prepMul4x2's loop over the first m columns (a positive
// multiple of 8), continuing the accumulators acc = [a0..a3, b0..b3]; e0 and
// e1 are nil or both set.
//
//go:noescape
func prepMul4x2AVX2(acc *[8]float32, mp0, mp1, g0, g1, e0, e1, q *float32, m int)

// unpackBitsAVX2 runs unpackBits' loop over n values (a positive multiple of
// 8): d[8j+k] = (or +=) pos when bits[j] bit k is set, else neg.
//
//go:noescape
func unpackBitsAVX2(d *float32, bits *byte, n int, neg, pos float32, add bool)

// qsgdPack4AVX2 runs qsgdPack's loop for 4-bit codes over n values (a
// positive multiple of 8): out[j] = code(v[2j]) | code(v[2j+1])<<4, with
// qsgdCode's arithmetic (no fused multiply-add).
//
//go:noescape
func qsgdPack4AVX2(out *byte, v, u *float32, n int, scale float32, s int32)

// sumSqAVX2 adds float64(src[i])² into acc[i%4] in index order, for n a
// positive multiple of 4.
//
//go:noescape
func sumSqAVX2(src *float32, n int, acc *[4]float64)

// fillUniformAVX2 runs fillUniform's loop over n values (a positive
// multiple of 8), x being the counter state of the first pair.
//
//go:noescape
func fillUniformAVX2(u *float32, n int, x uint64)

// qsgdDecode4AVX2 runs decodeBlock's loop for 4-bit codes over n values (a
// positive multiple of 8): d[i] = (or d[i] +) signed[code i]·scale.
//
//go:noescape
func qsgdDecode4AVX2(d *float32, codes *byte, n int, scale float32, add bool)
