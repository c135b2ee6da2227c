// Package statesync implements the state protocol (/p2ptrain/state/1.0.0),
// which hands a peer's training state to a joiner or to a peer that fell
// behind, the stage-state protocol (/p2ptrain/stage-state/1.0.0), which
// hands one pipeline stage's state, named by the client, to a peer that
// joins a pipeline's stages into another layout, and the layout protocol
// (/p2ptrain/layout/1.0.0), which hands a description of what a peer's
// state holds (an external trainer's parameter names and shapes) to a peer
// whose own differs, so that it can name the difference.
package statesync

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/zap"
)

// The client writes the 8-byte little-endian step it wants (the stage-state
// protocol: then the 4-byte little-endian stage; the layout protocol:
// nothing); the server answers a
// status byte, then on success an 8-byte length, the state bytes and their
// SHA-256.

const (
	stateOK       byte = 0
	stateWrongPos byte = 1
	stateNone     byte = 2
	stateRefused  byte = 3

	// MaxBytes bounds a transferred state (parameters + optimizer state)
	// when the client gives no tighter bound.
	MaxBytes = 2 << 30
	// stateIOTimeout bounds a whole transfer.
	stateIOTimeout = 5 * time.Minute
)

// ID is the state protocol's libp2p protocol ID, StageID the stage-state
// protocol's.
const (
	ID       protocol.ID = "/p2ptrain/state/1.0.0"
	StageID  protocol.ID = "/p2ptrain/stage-state/1.0.0"
	LayoutID protocol.ID = "/p2ptrain/layout/1.0.0"
)

// MaxLayoutBytes bounds a transferred layout description: 4 MiB describe
// some hundred thousand tensors.
const MaxLayoutBytes = 4 << 20

// MaxStage bounds the stage a stage-state request names.
const MaxStage = 1 << 16

// ErrUnavailable: the peer asked holds no state at the wanted step.
var ErrUnavailable = errors.New("statesync: state unavailable at the requested step")

// Source returns the serialized training state after step completed
// steps for the peer from (a peer ID string), or ErrUnavailable if this
// peer is not at that step, or ErrRefused if it does not serve from.
type Source func(from string, step uint64) ([]byte, error)

// StageSource returns the serialized state of pipeline stage stage after
// step completed steps for the peer from, with Source's errors.
type StageSource func(from string, step uint64, stage int) ([]byte, error)

// ErrRefused: the server does not serve its state to the requesting peer
// (for example, one that is not a member of its ring epoch).
var ErrRefused = errors.New("statesync: state refused to this peer")

// Server answers state requests on a host from its current Source.
type Server struct {
	h   host.Host
	log *zap.Logger

	mu        sync.Mutex
	src       Source
	stageSrc  StageSource
	layoutSrc LayoutSource
}

// LayoutSource returns the description of this peer's layout for the peer
// from, or ErrUnavailable while it has none.
type LayoutSource func(from string) ([]byte, error)

// NewServer returns a server on h that serves nothing until SetSource.
func NewServer(h host.Host, log *zap.Logger) *Server { return &Server{h: h, log: log} }

// SetSource serves the training state from src (nil stops serving).
func (srv *Server) SetSource(src Source) {
	srv.mu.Lock()
	srv.src = src
	srv.mu.Unlock()
	srv.handle(ID, src != nil, srv.serve)
}

// SetStageSource serves pipeline stages' states from src (nil stops).
func (srv *Server) SetStageSource(src StageSource) {
	srv.mu.Lock()
	srv.stageSrc = src
	srv.mu.Unlock()
	srv.handle(StageID, src != nil, srv.serveStage)
}

// SetLayoutSource serves the layout description from src (nil stops).
func (srv *Server) SetLayoutSource(src LayoutSource) {
	srv.mu.Lock()
	srv.layoutSrc = src
	srv.mu.Unlock()
	srv.handle(LayoutID, src != nil, srv.serveLayout)
}

// handle sets protocol id's handler to h, or removes it when not on.
func (srv *Server) handle(id protocol.ID, on bool, h network.StreamHandler) {
	if !on {
		srv.h.RemoveStreamHandler(id)
		return
	}
	srv.h.SetStreamHandler(id, h)
}

func (srv *Server) serve(s network.Stream) {
	srv.answer(s, 8, func(from string, req []byte) ([]byte, uint64, error) {
		step := binary.LittleEndian.Uint64(req)
		srv.mu.Lock()
		src := srv.src
		srv.mu.Unlock()
		if src == nil {
			return nil, step, errNoSource
		}
		b, err := src(from, step)
		return b, step, err
	})
}

func (srv *Server) serveStage(s network.Stream) {
	srv.answer(s, 12, func(from string, req []byte) ([]byte, uint64, error) {
		step, stage := binary.LittleEndian.Uint64(req), binary.LittleEndian.Uint32(req[8:])
		srv.mu.Lock()
		src := srv.stageSrc
		srv.mu.Unlock()
		switch {
		case src == nil:
			return nil, step, errNoSource
		case stage >= MaxStage:
			return nil, step, fmt.Errorf("%w: stage %d (at most %d)", ErrRefused, stage, MaxStage-1)
		}
		b, err := src(from, step, int(stage))
		return b, step, err
	})
}

func (srv *Server) serveLayout(s network.Stream) {
	srv.answer(s, 0, func(from string, _ []byte) ([]byte, uint64, error) {
		srv.mu.Lock()
		src := srv.layoutSrc
		srv.mu.Unlock()
		if src == nil {
			return nil, 0, errNoSource
		}
		b, err := src(from)
		return b, 0, err
	})
}

// errNoSource: the server serves no state of that kind.
var errNoSource = errors.New("statesync: no state served")

// answer reads a request of reqLen bytes on s and writes what get returns
// for it: the state, or the status of its error.
func (srv *Server) answer(s network.Stream, reqLen int, get func(from string, req []byte) ([]byte, uint64, error)) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(stateIOTimeout))
	req := make([]byte, reqLen)
	if _, err := io.ReadFull(s, req); err != nil {
		s.Reset()
		return
	}
	b, step, err := get(s.Conn().RemotePeer().String(), req)
	if err != nil {
		code := stateNone
		switch {
		case errors.Is(err, ErrUnavailable):
			code = stateWrongPos
		case errors.Is(err, ErrRefused):
			code = stateRefused
			srv.log.Warn("refused a state request", zap.Stringer("peer", s.Conn().RemotePeer()), zap.Error(err))
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
			srv.log.Warn("state transfer interrupted", zap.Stringer("peer", s.Conn().RemotePeer()), zap.Error(err))
			s.Reset()
			return
		}
	}
	what := "sent training state"
	if s.Protocol() == LayoutID {
		what = "sent the layout description"
	}
	srv.log.Info(what, zap.Stringer("peer", s.Conn().RemotePeer()), zap.Uint64("step", step), zap.Int("bytes", len(b)),
		zap.String("protocol", string(s.Protocol())))
}

// Fetch downloads the training state after step completed steps from peer
// p over h and verifies its checksum. A state larger than max bytes (or
// MaxBytes when max is 0) is refused before it is read.
func Fetch(ctx context.Context, h host.Host, p peer.ID, step uint64, max uint64) ([]byte, error) {
	return fetch(ctx, h, p, ID, binary.LittleEndian.AppendUint64(nil, step), step, max)
}

// FetchStage downloads pipeline stage stage's state after step completed
// steps from peer p over h (the stage-state protocol), as Fetch does.
func FetchStage(ctx context.Context, h host.Host, p peer.ID, step uint64, stage int, max uint64) ([]byte, error) {
	if stage < 0 || stage >= MaxStage {
		return nil, fmt.Errorf("statesync: stage %d (want 0 to %d)", stage, MaxStage-1)
	}
	req := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint64(nil, step), uint32(stage))
	return fetch(ctx, h, p, StageID, req, step, max)
}

// FetchLayout downloads peer p's layout description over h (the layout
// protocol), as Fetch does, refusing more than MaxLayoutBytes.
func FetchLayout(ctx context.Context, h host.Host, p peer.ID) ([]byte, error) {
	return fetch(ctx, h, p, LayoutID, nil, 0, MaxLayoutBytes)
}

// fetch sends req on a stream of protocol proto to p and reads the state
// it answers.
func fetch(ctx context.Context, h host.Host, p peer.ID, proto protocol.ID, req []byte, step, max uint64) ([]byte, error) {
	what := "state"
	if proto == LayoutID {
		what = "layout description"
	}
	if max == 0 || max > MaxBytes {
		max = MaxBytes
	}
	ctx, cancel := context.WithTimeout(ctx, stateIOTimeout)
	defer cancel()
	s, err := h.NewStream(ctx, p, proto)
	if err != nil {
		return nil, fmt.Errorf("statesync: open %s stream to %s: %w", what, p, err)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	defer s.Close()
	if len(req) > 0 {
		if _, err := s.Write(req); err != nil {
			return nil, fmt.Errorf("statesync: request %s from %s: %w", what, p, err)
		}
	}
	var hdr [9]byte
	if _, err := io.ReadFull(s, hdr[:1]); err != nil {
		return nil, fmt.Errorf("statesync: %s from %s: %w", what, p, err)
	}
	switch hdr[0] {
	case stateOK:
	case stateWrongPos:
		return nil, fmt.Errorf("%w: %s is not at step %d", ErrUnavailable, p, step)
	case stateNone:
		return nil, fmt.Errorf("%w: %s serves no %s", ErrUnavailable, p, what)
	case stateRefused:
		return nil, fmt.Errorf("%w: %s does not serve this peer", ErrRefused, p)
	default:
		return nil, fmt.Errorf("statesync: %s from %s: unknown status %d", what, p, hdr[0])
	}
	if _, err := io.ReadFull(s, hdr[1:]); err != nil {
		return nil, fmt.Errorf("statesync: %s from %s: %w", what, p, err)
	}
	size := binary.LittleEndian.Uint64(hdr[1:])
	if size > max {
		s.Reset()
		return nil, fmt.Errorf("statesync: %s from %s claims %d bytes (max %d)", what, p, size, max)
	}
	b := make([]byte, size)
	var sum [sha256.Size]byte
	if _, err := io.ReadFull(s, b); err != nil {
		return nil, fmt.Errorf("statesync: %s from %s: %w", what, p, err)
	}
	if _, err := io.ReadFull(s, sum[:]); err != nil {
		return nil, fmt.Errorf("statesync: %s checksum from %s: %w", what, p, err)
	}
	if sha256.Sum256(b) != sum {
		return nil, fmt.Errorf("statesync: %s from %s fails its checksum", what, p)
	}
	return b, nil
}
