package allreduce

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
)

// PeerID identifies a peer of a ring epoch (node uses the libp2p peer ID string).
type PeerID string

// Ring is one ring epoch as the engine sees it: its number, its peers in
// ring order, this peer, and the content digest. (gossip.Epoch is the same
// epoch as proposed and adopted; plan.EpochSpec derives a Ring from it.)
type Ring struct {
	// Number is the epoch number; every frame carries it and frames of another
	// epoch are refused.
	Number uint64
	// Peers is the ring in order (rank i sends reduce-scatter traffic to rank
	// i+1). All peers must hold the identical list. No duplicates.
	Peers []PeerID
	// Self is this peer; it must appear in Peers.
	Self PeerID
	// Digest identifies the epoch's content (for a gossip epoch, its
	// Digest). Two rings may carry one number; a transport that serves
	// several epochs matches number and digest, so their frames never mix.
	// Empty is allowed where numbers are unique (tests, benchmarks).
	Digest string
}

// Rank returns the index of p in e.Peers, or -1.
func (e Ring) Rank(p PeerID) int {
	for i, q := range e.Peers {
		if q == p {
			return i
		}
	}
	return -1
}

func (e Ring) validate() error {
	if len(e.Peers) == 0 {
		return fmt.Errorf("%w: epoch %d has no peers", ErrConfig, e.Number)
	}
	seen := make(map[PeerID]bool, len(e.Peers))
	for _, p := range e.Peers {
		if p == "" {
			return fmt.Errorf("%w: epoch %d: empty peer ID", ErrConfig, e.Number)
		}
		if seen[p] {
			return fmt.Errorf("%w: epoch %d: duplicate peer %s", ErrConfig, e.Number, p)
		}
		seen[p] = true
	}
	if !seen[e.Self] {
		return fmt.Errorf("%w: epoch %d: self %s not in peers", ErrConfig, e.Number, e.Self)
	}
	return nil
}

// Transport carries frames between the peers of one ring epoch. Package
// protocol/ringstream implements it over libp2p streams (one long-lived
// stream per peer pair per epoch, opened lazily, frames written with
// WriteFrame and read with ReadFrame); memtransport implements it in memory.
//
// Guarantees an implementation must give:
//   - Message-oriented: a frame handed to Send arrives whole, as one Recv result,
//     or not at all.
//   - Reliable and ordered per pair: frames from A to B arrive in the order
//     A's Send calls returned, with no loss or duplication, until the link breaks.
//   - Send and Recv are safe for concurrent use; concurrent Sends to the same
//     peer are serialised (each frame written whole). At most one Recv per
//     source peer is outstanding at a time (allreduce runs one reader per peer).
//   - Send does not retain frame after it returns; Recv returns a slice the
//     caller owns.
//   - Send and Recv return promptly when ctx is done, when the link breaks (the
//     remote reset it, died, or was never reachable), or after Reset. Recv from
//     a peer that never sends blocks until one of those happens.
//   - Recv never returns a frame longer than the maximum frame size it was
//     configured with (Config.MaxFrameBytes): a longer length prefix is an
//     error (wrapping ErrFrameTooLarge) read without allocating the frame.
//     Frame contents are validated by allreduce, not by the Transport.
//   - Reset(reason) breaks every link of this epoch for this peer (stream
//     resets): pending and later Send/Recv here fail, and remote peers' Send
//     to and Recv from this peer fail soon after (after any frames already
//     delivered to them), so a failure propagates without waiting for timeouts.
//
// A Transport belongs to one epoch; a new epoch gets a new Transport.
type Transport interface {
	// Send delivers frame to peer to.
	Send(ctx context.Context, to PeerID, frame []byte) error
	// Recv returns the next frame from peer from.
	Recv(ctx context.Context, from PeerID) ([]byte, error)
	// Reset aborts every link of this peer in this epoch.
	Reset(reason error)
}

// EpochTransport is a Transport opened for one ring epoch by its owner
// (package protocol/ringstream's Service.Open).
type EpochTransport interface {
	Transport
	// Close ends the epoch gracefully (frames already sent are delivered);
	// call it after closing the epoch's Session.
	Close() error
	// Sent returns the bytes Send wrote successfully in this epoch.
	Sent() uint64
}

// WriteFrame writes frame to w as a 4-byte little-endian length prefix
// followed by the frame, in one Write call (so a message-oriented stream,
// such as a yamux stream under Noise, sends it without a separate tiny
// message for the prefix). The prefix and frame are assembled in buf, which
// is returned, grown if it had to be, for the next call to reuse.
func WriteFrame(w io.Writer, frame []byte, buf []byte) ([]byte, error) {
	buf = append(buf[:0], 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(buf, uint32(len(frame)))
	buf = append(buf, frame...)
	_, err := w.Write(buf)
	return buf, err
}

// ReadFrame reads one length-prefixed frame written by WriteFrame. A length
// above max is refused with an error wrapping ErrFrameTooLarge before anything
// is allocated; the stream should then be reset. buf is reused when large enough.
func ReadFrame(r io.Reader, max int, buf []byte) ([]byte, error) {
	return ReadFrameInto(r, max, func(n int) []byte {
		if cap(buf) < n {
			return make([]byte, n)
		}
		return buf[:n]
	})
}

// ReadFrameInto is ReadFrame into the buffer alloc(n) returns for a frame
// of n bytes (n at most max; the buffer's length must be n).
func ReadFrameInto(r io.Reader, max int, alloc func(n int) []byte) ([]byte, error) {
	var p [4]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(p[:])
	if max < 0 || uint64(n) > uint64(max) {
		return nil, fmt.Errorf("%w: length %d > max %d", ErrFrameTooLarge, n, max)
	}
	buf := alloc(int(n))
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// FrameReceiver is an optional interface of a Transport: RecvInto is Recv
// into the buffer alloc(n) returns for a frame of n bytes, so that a
// Session reuses the buffers of the frames it has consumed. The returned
// frame is that buffer; the caller owns it.
type FrameReceiver interface {
	RecvInto(ctx context.Context, from PeerID, alloc func(n int) []byte) ([]byte, error)
}

// FrameRejecter is an optional interface of a Transport: a Session tells it
// of every frame from a peer that it refused (one that failed validation,
// named another epoch or codec, fell outside the round's step window, or was
// too large), just before the refusal fails the session. Package
// protocol/ringstream counts them for the node's metrics.
type FrameRejecter interface {
	// FrameRejected reports a frame from peer from refused with err (which
	// wraps ErrBadFrame, ErrEpochMismatch, ErrCodecMismatch or
	// ErrFrameTooLarge). It must not block.
	FrameRejected(from PeerID, err error)
}
