package allreduce

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them (usually
// inside a *PeerError that names the peer responsible), so callers test with
// errors.Is.
var (
	// ErrTimeout: a frame from a peer did not arrive within the frame deadline.
	ErrTimeout = errors.New("allreduce: timeout")
	// ErrPeerFailed: a peer's link broke (stream reset, peer died) or the peer
	// aborted the round.
	ErrPeerFailed = errors.New("allreduce: peer failed")
	// ErrEpochMismatch: a frame carried another ring epoch.
	ErrEpochMismatch = errors.New("allreduce: epoch mismatch")
	// ErrBadFrame: a frame failed validation (version, length, header fields,
	// unexpected chunk, corrupt payload).
	ErrBadFrame = errors.New("allreduce: bad frame")
	// ErrFrameTooLarge: a frame is larger than the configured maximum.
	ErrFrameTooLarge = errors.New("allreduce: frame too large")
	// ErrCodecMismatch: a frame was encoded with another codec than the bucket's.
	ErrCodecMismatch = errors.New("allreduce: codec mismatch")
	// ErrAborted: the round was aborted locally (context canceled, invalid
	// bucket, internal error) or the session had already failed.
	ErrAborted = errors.New("allreduce: aborted")
	// ErrClosed: the session was closed.
	ErrClosed = errors.New("allreduce: session closed")
	// ErrConfig: invalid configuration, epoch or bucket.
	ErrConfig = errors.New("allreduce: invalid configuration")
)

// PeerError is the error of a failed round. Peer names the peer held
// responsible (the one whose link broke, whose frame was late or invalid);
// Reporter is the peer that detected the failure (this peer, or the neighbour
// whose abort notice told us about it).
type PeerError struct {
	Peer     PeerID
	Reporter PeerID
	Epoch    uint64
	Step     uint64
	Bucket   uint32
	Err      error
}

// Error implements error.
func (e *PeerError) Error() string {
	via := ""
	if e.Reporter != "" {
		via = fmt.Sprintf(" (reported by %s)", e.Reporter)
	}
	return fmt.Sprintf("allreduce: peer %s, epoch %d, step %d, bucket %d%s: %v",
		e.Peer, e.Epoch, e.Step, e.Bucket, via, e.Err)
}

// Unwrap returns the underlying error (which wraps one of the sentinels).
func (e *PeerError) Unwrap() error { return e.Err }

// abort kinds carried in abort frames.
const (
	kindOther byte = iota
	kindTimeout
	kindPeerFailed
	kindEpoch
	kindBadFrame
	kindTooLarge
	kindCodec
	kindAborted
)

func kindOf(err error) byte {
	switch {
	case errors.Is(err, ErrTimeout):
		return kindTimeout
	case errors.Is(err, ErrEpochMismatch):
		return kindEpoch
	case errors.Is(err, ErrFrameTooLarge):
		return kindTooLarge
	case errors.Is(err, ErrCodecMismatch):
		return kindCodec
	case errors.Is(err, ErrBadFrame):
		return kindBadFrame
	case errors.Is(err, ErrPeerFailed):
		return kindPeerFailed
	case errors.Is(err, ErrAborted):
		return kindAborted
	}
	return kindOther
}

func sentinelOf(k byte) error {
	switch k {
	case kindTimeout:
		return ErrTimeout
	case kindEpoch:
		return ErrEpochMismatch
	case kindTooLarge:
		return ErrFrameTooLarge
	case kindCodec:
		return ErrCodecMismatch
	case kindBadFrame:
		return ErrBadFrame
	case kindPeerFailed:
		return ErrPeerFailed
	}
	return ErrAborted
}
