// Package finite finds NaN and ±Inf in float32 data: the one check that
// the model, the all-reduce and state transfer all make on every step or
// state, written once and fast (an exponent-bit test per value instead of
// two float64 classifications, two values per 64-bit word).
package finite

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// expMask is a float32's exponent bits: all set means NaN or ±Inf.
const expMask = 0x7f800000

// Two float32 lanes of a 64-bit word: a lane's exponent bits (pairMask)
// plus its exponent's lowest bit (pairCarry) carry into the lane's top
// bit (pairTop) exactly when the exponent is all ones. The sign bit is
// masked off first, so no lane carries into the next.
const (
	pairMask  = expMask<<32 | expMask
	pairCarry = 0x00800000<<32 | 0x00800000
	pairTop   = 0x80000000<<32 | 0x80000000
)

// Has reports whether v holds a NaN or ±Inf. The reference loop is
//
//	for _, x := range v { if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) { return true } }
func Has(v []float32) bool {
	// Sixteen values (eight words) per iteration, one branch, no
	// comparison per value. Whatever the host's byte order, each half of
	// a word loaded in native order is one value's bits.
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	for len(b) >= 64 {
		w0 := binary.NativeEndian.Uint64(b[0:8])&pairMask + pairCarry
		w1 := binary.NativeEndian.Uint64(b[8:16])&pairMask + pairCarry
		w2 := binary.NativeEndian.Uint64(b[16:24])&pairMask + pairCarry
		w3 := binary.NativeEndian.Uint64(b[24:32])&pairMask + pairCarry
		w4 := binary.NativeEndian.Uint64(b[32:40])&pairMask + pairCarry
		w5 := binary.NativeEndian.Uint64(b[40:48])&pairMask + pairCarry
		w6 := binary.NativeEndian.Uint64(b[48:56])&pairMask + pairCarry
		w7 := binary.NativeEndian.Uint64(b[56:64])&pairMask + pairCarry
		if (w0|w1|w2|w3|w4|w5|w6|w7)&pairTop != 0 {
			return true
		}
		b = b[64:]
	}
	for _, x := range v[len(v)-len(b)/4:] {
		if math.Float32bits(x)&expMask == expMask {
			return true
		}
	}
	return false
}

// FirstInBytes returns the index of the first NaN or ±Inf among the
// little-endian float32 values of b (a trailing partial value is
// ignored), or -1.
func FirstInBytes(b []byte) int {
	for i := 0; i+4 <= len(b); i += 4 {
		if binary.LittleEndian.Uint32(b[i:])&expMask == expMask {
			return i / 4
		}
	}
	return -1
}
