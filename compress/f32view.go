package compress

import (
	"encoding/binary"
	"unsafe"
)

// hostLittleEndian says whether this machine keeps float32 values in memory
// in the wire's byte order, so fp32 payloads can be copied instead of
// converted value by value.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// f32Memory returns the memory of v as bytes when that is already the wire
// encoding (a little-endian machine), else nil.
func f32Memory(v []float32) []byte {
	if !hostLittleEndian || len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

// f32View returns the first n little-endian fp32 values of b without copying
// when the machine is little-endian and b is 4-byte aligned, else nil. b
// must hold at least 4n bytes.
func f32View(b []byte, n int) []float32 {
	if !hostLittleEndian || n == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return nil
	}
	_ = b[4*n-1]
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)
}
