package node

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"
)

// The state protocol (/p2ptrain/state/1.0.0) hands a peer's training state to
// a joiner or a peer that fell behind. The client writes the 8-byte
// little-endian step it wants; the server answers a status byte, then on
// success an 8-byte length, the state bytes and their SHA-256.

const (
	stateOK       byte = 0
	stateWrongPos byte = 1
	stateNone     byte = 2

	// maxStateBytes bounds a transferred state (parameters + optimizer state).
	maxStateBytes = 2 << 30
	// stateIOTimeout bounds a whole transfer.
	stateIOTimeout = 5 * time.Minute
)

// ErrStateUnavailable: the peer asked holds no state at the wanted step.
var ErrStateUnavailable = errors.New("node: state unavailable at the requested step")

// StateSource returns the serialized training state after step completed
// steps, or ErrStateUnavailable if this peer is not at that step.
type StateSource func(step uint64) ([]byte, error)

// SetStateSource serves the training state to peers (nil stops serving).
func (n *Node) SetStateSource(src StateSource) {
	n.mu.Lock()
	n.stateSrc = src
	n.mu.Unlock()
	if src == nil {
		n.host.RemoveStreamHandler(ProtocolState)
		return
	}
	n.host.SetStreamHandler(ProtocolState, n.serveState)
}

func (n *Node) serveState(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(stateIOTimeout))
	var req [8]byte
	if _, err := io.ReadFull(s, req[:]); err != nil {
		s.Reset()
		return
	}
	step := binary.LittleEndian.Uint64(req[:])
	n.mu.Lock()
	src := n.stateSrc
	n.mu.Unlock()
	if src == nil {
		_, _ = s.Write([]byte{stateNone})
		return
	}
	b, err := src(step)
	if err != nil {
		code := stateNone
		if errors.Is(err, ErrStateUnavailable) {
			code = stateWrongPos
		}
		_, _ = s.Write([]byte{code})
		return
	}
	sum := sha256.Sum256(b)
	hdr := make([]byte, 9)
	hdr[0] = stateOK
	binary.LittleEndian.PutUint64(hdr[1:], uint64(len(b)))
	for _, part := range [][]byte{hdr, b, sum[:]} {
		if _, err := s.Write(part); err != nil {
			n.log.Warn("state transfer interrupted", zap.Stringer("peer", s.Conn().RemotePeer()), zap.Error(err))
			s.Reset()
			return
		}
	}
	n.log.Info("sent training state", zap.Stringer("peer", s.Conn().RemotePeer()), zap.Uint64("step", step), zap.Int("bytes", len(b)))
}

// FetchState downloads the training state after step completed steps from
// peer p and verifies its checksum.
func (n *Node) FetchState(ctx context.Context, p peer.ID, step uint64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, stateIOTimeout)
	defer cancel()
	n.learnAddrs(p)
	s, err := n.host.NewStream(ctx, p, ProtocolState)
	if err != nil {
		return nil, fmt.Errorf("node: open state stream to %s: %w", p, err)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	defer s.Close()
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], step)
	if _, err := s.Write(req[:]); err != nil {
		return nil, fmt.Errorf("node: request state from %s: %w", p, err)
	}
	var hdr [9]byte
	if _, err := io.ReadFull(s, hdr[:1]); err != nil {
		return nil, fmt.Errorf("node: state from %s: %w", p, err)
	}
	switch hdr[0] {
	case stateOK:
	case stateWrongPos:
		return nil, fmt.Errorf("%w: %s is not at step %d", ErrStateUnavailable, p, step)
	case stateNone:
		return nil, fmt.Errorf("%w: %s serves no state", ErrStateUnavailable, p)
	default:
		return nil, fmt.Errorf("node: state from %s: unknown status %d", p, hdr[0])
	}
	if _, err := io.ReadFull(s, hdr[1:]); err != nil {
		return nil, fmt.Errorf("node: state from %s: %w", p, err)
	}
	size := binary.LittleEndian.Uint64(hdr[1:])
	if size > maxStateBytes {
		s.Reset()
		return nil, fmt.Errorf("node: state from %s claims %d bytes (max %d)", p, size, maxStateBytes)
	}
	b := make([]byte, size)
	var sum [sha256.Size]byte
	if _, err := io.ReadFull(s, b); err != nil {
		return nil, fmt.Errorf("node: state from %s: %w", p, err)
	}
	if _, err := io.ReadFull(s, sum[:]); err != nil {
		return nil, fmt.Errorf("node: state checksum from %s: %w", p, err)
	}
	if sha256.Sum256(b) != sum {
		return nil, fmt.Errorf("node: state from %s fails its checksum", p)
	}
	return b, nil
}
