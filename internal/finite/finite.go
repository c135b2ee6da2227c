// Package finite finds NaN and ±Inf in float32 data: the one check that
// the model, the all-reduce and state transfer all make on every step or
// state, written once and fast (an exponent-bit test per value instead of
// two float64 classifications).
package finite

import (
	"encoding/binary"
	"math"
)

// expMask is a float32's exponent bits: all set means NaN or ±Inf.
const expMask = 0x7f800000

// Has reports whether v holds a NaN or ±Inf. The reference loop is
//
//	for _, x := range v { if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) { return true } }
func Has(v []float32) bool {
	// Four lanes per iteration, one branch: a lane is non-finite when its
	// exponent bits are all set.
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b := math.Float32bits(v[i])&expMask, math.Float32bits(v[i+1])&expMask
		c, d := math.Float32bits(v[i+2])&expMask, math.Float32bits(v[i+3])&expMask
		if a == expMask || b == expMask || c == expMask || d == expMask {
			return true
		}
	}
	for ; i < len(v); i++ {
		if math.Float32bits(v[i])&expMask == expMask {
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
