package allreduce

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
)

// FrameVersion is the frame format version this package speaks.
const FrameVersion = 1

// HeaderSize is the size of a frame header in bytes.
const HeaderSize = 36

// Phase says which part of a schedule a frame belongs to. The low 4 bits are
// the kind (PhaseReduce, PhaseGather, PhaseAbort); the high 4 bits are a
// sub-round: 0 for the bucket's data, 1 for the MAX all-reduce of shared
// scales, r for round r of a low-rank codec's factor all-reduces.
type Phase uint8

// Phase kinds.
const (
	// PhaseReduce carries partial sums / contributions (reduce-scatter).
	PhaseReduce Phase = 2
	// PhaseGather carries final owner bytes (all-gather).
	PhaseGather Phase = 3
	// PhaseAbort announces that the sender's session failed; the payload names
	// the culprit peer and the reason kind.
	PhaseAbort Phase = 15
)

// Kind returns the phase kind (low 4 bits).
func (p Phase) Kind() Phase { return p & 0x0f }

// Sub returns the sub-round (high 4 bits).
func (p Phase) Sub() int { return int(p >> 4) }

func subPhase(kind Phase, sub int) Phase { return kind | Phase(sub<<4) }

// Header is the fixed header of every frame (little-endian on the wire):
//
//	off size field
//	  0    1 version (FrameVersion)
//	  1    1 phase
//	  2    2 reserved (0)
//	  4    4 codec id (CodecID of the payload's codec spec)
//	  8    8 epoch
//	 16    8 step
//	 24    4 bucket
//	 28    4 chunk (index of the chunk within the bucket's schedule)
//	 32    4 payload length
//	 36      payload
type Header struct {
	Version uint8
	Phase   Phase
	Codec   uint32
	Epoch   uint64
	Step    uint64
	Bucket  uint32
	Chunk   uint32
	Length  uint32
}

// CodecID is the 32-bit identifier of a codec spec carried in frames (FNV-1a
// of the canonical spec string): a frame encoded with another codec than the
// bucket's is refused.
func CodecID(spec string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(spec))
	return h.Sum32()
}

// PutHeader writes h into b[:HeaderSize] (Version is forced to FrameVersion).
func PutHeader(b []byte, h Header) {
	_ = b[HeaderSize-1]
	b[0] = FrameVersion
	b[1] = byte(h.Phase)
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], h.Codec)
	binary.LittleEndian.PutUint64(b[8:], h.Epoch)
	binary.LittleEndian.PutUint64(b[16:], h.Step)
	binary.LittleEndian.PutUint32(b[24:], h.Bucket)
	binary.LittleEndian.PutUint32(b[28:], h.Chunk)
	binary.LittleEndian.PutUint32(b[32:], h.Length)
}

// MarshalFrame appends a frame with header h (Length set from payload) and
// payload to dst.
func MarshalFrame(dst []byte, h Header, payload []byte) []byte {
	h.Length = uint32(len(payload))
	n := len(dst)
	dst = append(dst, make([]byte, HeaderSize)...)
	PutHeader(dst[n:], h)
	return append(dst, payload...)
}

// UnmarshalFrame parses and validates frame b: version, known phase, zero
// reserved bits, total size <= max and length field equal to the payload
// size. The payload aliases b; nothing is allocated. Errors wrap
// ErrFrameTooLarge or ErrBadFrame.
func UnmarshalFrame(b []byte, max int) (Header, []byte, error) {
	var h Header
	if len(b) > max {
		return h, nil, fmt.Errorf("%w: %d bytes > max %d", ErrFrameTooLarge, len(b), max)
	}
	if len(b) < HeaderSize {
		return h, nil, fmt.Errorf("%w: %d bytes, shorter than the header", ErrBadFrame, len(b))
	}
	h.Version = b[0]
	if h.Version != FrameVersion {
		return h, nil, fmt.Errorf("%w: version %d, want %d", ErrBadFrame, h.Version, FrameVersion)
	}
	h.Phase = Phase(b[1])
	switch h.Phase.Kind() {
	case PhaseReduce, PhaseGather:
	case PhaseAbort:
		if h.Phase.Sub() != 0 {
			return h, nil, fmt.Errorf("%w: abort phase with sub-round %d", ErrBadFrame, h.Phase.Sub())
		}
	default:
		return h, nil, fmt.Errorf("%w: unknown phase %#x", ErrBadFrame, b[1])
	}
	if b[2] != 0 || b[3] != 0 {
		return h, nil, fmt.Errorf("%w: reserved bits set", ErrBadFrame)
	}
	h.Codec = binary.LittleEndian.Uint32(b[4:])
	h.Epoch = binary.LittleEndian.Uint64(b[8:])
	h.Step = binary.LittleEndian.Uint64(b[16:])
	h.Bucket = binary.LittleEndian.Uint32(b[24:])
	h.Chunk = binary.LittleEndian.Uint32(b[28:])
	h.Length = binary.LittleEndian.Uint32(b[32:])
	if uint64(h.Length) != uint64(len(b)-HeaderSize) {
		return h, nil, fmt.Errorf("%w: length field %d, payload %d bytes", ErrBadFrame, h.Length, len(b)-HeaderSize)
	}
	return h, b[HeaderSize:], nil
}

// abort payload: kind(1) culpritLen(1) culprit msgLen(2) msg.
const maxAbortMsg = 512

func marshalAbort(dst []byte, h Header, culprit PeerID, kind byte, msg string) []byte {
	if len(culprit) > 255 {
		culprit = culprit[:255]
	}
	if len(msg) > maxAbortMsg {
		msg = msg[:maxAbortMsg]
	}
	p := make([]byte, 0, 4+len(culprit)+len(msg))
	p = append(p, kind, byte(len(culprit)))
	p = append(p, culprit...)
	p = binary.LittleEndian.AppendUint16(p, uint16(len(msg)))
	p = append(p, msg...)
	h.Phase = PhaseAbort
	h.Codec = 0
	return MarshalFrame(dst, h, p)
}

func unmarshalAbort(p []byte) (culprit PeerID, kind byte, msg string, err error) {
	if len(p) < 2 {
		return "", 0, "", fmt.Errorf("%w: short abort payload", ErrBadFrame)
	}
	kind = p[0]
	n := int(p[1])
	if len(p) < 2+n+2 {
		return "", 0, "", fmt.Errorf("%w: short abort payload", ErrBadFrame)
	}
	culprit = PeerID(p[2 : 2+n])
	m := int(binary.LittleEndian.Uint16(p[2+n:]))
	if m > maxAbortMsg || len(p) != 4+n+m {
		return "", 0, "", fmt.Errorf("%w: abort payload length", ErrBadFrame)
	}
	return culprit, kind, string(p[4+n:]), nil
}
