package ringstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/protocol/directlink"
)

// Stream modes (the byte after the hello) and the answers on the stream.
const (
	modeStream byte = 0 // the frames follow on the stream
	modeDial   byte = 1 // the receiver offers a direct link, the opener dials it
	modeListen byte = 2 // the opener offers a direct link, the receiver dials it

	answerNo  byte = 0
	answerYes byte = 1
)

// tcpIP returns the IP address of a TCP multiaddr (nil: not IP and TCP).
func tcpIP(a ma.Multiaddr) net.IP {
	na, err := manet.ToNetAddr(a)
	if err != nil {
		return nil
	}
	if ta, ok := na.(*net.TCPAddr); ok {
		return ta.IP
	}
	return nil
}

// directCapable says whether the stream's connection can carry a direct
// link: an unlimited (not relayed) TCP connection.
func directCapable(s network.Stream) bool {
	c := s.Conn()
	return !c.Stat().Limited && tcpIP(c.LocalMultiaddr()) != nil && tcpIP(c.RemoteMultiaddr()) != nil
}

// linkFailed records that a direct link with peer id failed: this end
// neither asks for nor dials one with it for noDirectTTL.
func (rn *Service) linkFailed(id peer.ID, err error) {
	rn.log.Info("direct link failed; frames go over the libp2p stream", zap.Stringer("peer", id), zap.Error(err))
	rn.mu.Lock()
	rn.dialFail[id] = time.Now()
	rn.mu.Unlock()
}

// directAllowed says whether a direct link with peer id over s may be
// tried: direct links on, s's connection capable, and no failure with the
// peer within noDirectTTL.
func (rn *Service) directAllowed(id peer.ID, s network.Stream) bool {
	if !directCapable(s) {
		return false
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.noDirect {
		return false
	}
	at, failed := rn.dialFail[id]
	return !failed || time.Since(at) > noDirectTTL
}

// openMode returns the mode the opener of s asks peer id for. The end that
// accepted the libp2p connection listens: the other end reached that
// address once already, so a peer behind a NAT dials out rather than
// waiting for a dial that its NAT drops.
func (rn *Service) openMode(id peer.ID, s network.Stream) byte {
	switch {
	case !rn.directAllowed(id, s):
		return modeStream
	case s.Conn().Stat().Direction == network.DirInbound:
		return modeListen
	default:
		return modeDial
	}
}

// readAnswer reads one answer byte from s by deadline.
func readAnswer(s network.Stream, deadline time.Time, what string) (byte, error) {
	_ = s.SetReadDeadline(deadline)
	var b [1]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		return 0, fmt.Errorf("read %s: %w", what, err)
	}
	return b[0], nil
}

// watchReader closes d when s is reset or its connection lost. The end of
// the stream (the opener closed it after its last frame) does not: frames
// may still wait in the link.
func watchReader(s network.Stream, d *directlink.Reader) {
	_ = s.SetReadDeadline(time.Time{})
	go func() {
		if _, err := io.Copy(io.Discard, s); err != nil {
			d.Close()
		}
	}()
}

// watchWriter closes d when s's read side ends: a reset, a lost
// connection, or this end's Close. Records already written are still
// delivered.
func watchWriter(s network.Stream, d *directlink.Writer) {
	_ = s.SetReadDeadline(time.Time{})
	go func() {
		_, _ = io.Copy(io.Discard, s)
		d.Close()
	}()
}

// offerLink is the receiver's side of modeDial: it offers a direct link
// and waits for the opener's choice and its dial. It returns the link, or
// nil when the frames come on the stream.
func (rn *Service) offerLink(s network.Stream) (*directlink.Reader, error) {
	var lst *directlink.Listener
	if rn.directOn() && directCapable(s) {
		var err error
		if lst, err = directlink.Listen(tcpIP(s.Conn().LocalMultiaddr())); err != nil {
			rn.log.Debug("no direct link offered", zap.Error(err))
		}
	}
	if lst == nil {
		if _, err := s.Write([]byte{answerNo}); err != nil {
			return nil, fmt.Errorf("answer the stream mode: %w", err)
		}
		return nil, nil
	}
	defer lst.Close()
	if _, err := s.Write(append([]byte{answerYes}, lst.Offer()...)); err != nil {
		return nil, fmt.Errorf("offer a direct link: %w", err)
	}
	choice, err := readAnswer(s, time.Now().Add(helloTimeout+directDialTimeout), "the opener's choice")
	if err != nil || choice != answerYes {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), directAcceptTimeout)
	d, err := lst.Accept(ctx, rn.maxFrame)
	cancel()
	if ok, err := rn.accepted(s.Conn().RemotePeer(), s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// accepted is the listening end's part once its listener returned
// acceptErr: it confirms the link on s, or says no when the dial reached
// something else (a NAT, a proxy) or nothing in time, which it records. It
// reports whether the link stands; when not, link is closed.
func (rn *Service) accepted(id peer.ID, s network.Stream, link io.Closer, acceptErr error) (bool, error) {
	if acceptErr != nil {
		rn.linkFailed(id, fmt.Errorf("the dial did not arrive: %w", acceptErr))
		if _, err := s.Write([]byte{answerNo}); err != nil {
			return false, fmt.Errorf("refuse the direct link: %w", err)
		}
		return false, nil
	}
	if _, err := s.Write([]byte{answerYes}); err != nil {
		link.Close()
		return false, fmt.Errorf("confirm the direct link: %w", err)
	}
	return true, nil
}

// dialLink is the receiver's side of modeListen: it reads the opener's
// offer, dials it and waits for the opener's confirmation. It returns the
// link, or nil when the frames come on the stream.
func (rn *Service) dialLink(s network.Stream) (*directlink.Reader, error) {
	offer := make([]byte, directlink.OfferSize)
	if _, err := io.ReadFull(s, offer); err != nil {
		return nil, fmt.Errorf("read the direct link's offer: %w", err)
	}
	id := s.Conn().RemotePeer()
	if !rn.directAllowed(id, s) {
		if _, err := s.Write([]byte{answerNo}); err != nil {
			return nil, fmt.Errorf("answer the offer: %w", err)
		}
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), directDialTimeout)
	d, err := rn.dialReader(ctx, tcpIP(s.Conn().RemoteMultiaddr()), offer, rn.maxFrame)
	cancel()
	if ok, err := rn.dialed(id, s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// dialed is the dialing end's part once its dial returned dialErr: it
// answers on s (no after a failed dial, which it records) and after a yes
// reads the listening end's confirmation that its listener took the
// connection (a dial can reach a NAT or a proxy instead). It reports
// whether the link stands; when not, link is closed.
func (rn *Service) dialed(id peer.ID, s network.Stream, link io.Closer, dialErr error) (bool, error) {
	if dialErr != nil {
		rn.linkFailed(id, dialErr)
		if _, err := s.Write([]byte{answerNo}); err != nil {
			return false, fmt.Errorf("answer the direct link: %w", err)
		}
		return false, nil
	}
	if _, err := s.Write([]byte{answerYes}); err != nil {
		link.Close()
		return false, fmt.Errorf("answer the direct link: %w", err)
	}
	ok, err := readAnswer(s, time.Now().Add(directAcceptTimeout+helloTimeout), "the direct link's confirmation")
	if err != nil {
		link.Close()
		return false, err
	}
	if ok != answerYes {
		link.Close()
		rn.linkFailed(id, errors.New("the listening end did not accept the connection"))
		return false, nil
	}
	return true, nil
}

// dialOffered is the opener's side of modeDial: it reads the receiver's
// answer, dials its offer and waits for its confirmation. It returns the
// link, or nil when the frames go on the stream (no offer, or the dial
// failed; the stream says which to the receiver).
func (rn *Service) dialOffered(ctx context.Context, id peer.ID, s network.Stream) (*directlink.Writer, error) {
	defer s.SetReadDeadline(time.Time{})
	answer, err := readAnswer(s, time.Now().Add(helloTimeout), "the answer to a direct link")
	if err != nil || answer != answerYes {
		return nil, err
	}
	offer := make([]byte, directlink.OfferSize)
	if _, err := io.ReadFull(s, offer); err != nil {
		return nil, fmt.Errorf("read the direct link's offer: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, directDialTimeout)
	d, err := rn.dial(dctx, tcpIP(s.Conn().RemoteMultiaddr()), offer)
	cancel()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr // the send was cancelled, not the dial refused
		}
	}
	if ok, err := rn.dialed(id, s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// acceptDialed is the opener's side of modeListen, after its offer went
// out with the mode: it reads whether the receiver dialed, takes the
// connection and confirms it. It returns the link, or nil when the frames
// go on the stream.
func (rn *Service) acceptDialed(ctx context.Context, id peer.ID, s network.Stream, lst *directlink.Listener) (*directlink.Writer, error) {
	defer s.SetReadDeadline(time.Time{})
	answer, err := readAnswer(s, time.Now().Add(helloTimeout+directDialTimeout), "the answer to a direct link")
	if err != nil || answer != answerYes {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, directAcceptTimeout)
	d, err := lst.AcceptWriter(actx)
	cancel()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
	}
	if ok, err := rn.accepted(id, s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// openLink negotiates the frames' path on a new stream s to peer id: it
// writes head (the hello) and the mode, and runs the mode's exchange. It
// returns the direct link, or nil when the frames go on the stream.
func (rn *Service) openLink(ctx context.Context, id peer.ID, s network.Stream, head []byte) (*directlink.Writer, error) {
	mode := rn.openMode(id, s)
	var lst *directlink.Listener
	if mode == modeListen {
		var err error
		if lst, err = directlink.Listen(tcpIP(s.Conn().LocalMultiaddr())); err != nil {
			rn.log.Debug("no direct link offered", zap.Error(err))
			mode = modeStream
		} else {
			defer lst.Close()
		}
	}
	head = append(head, mode)
	if lst != nil {
		head = append(head, lst.Offer()...)
	}
	if _, err := s.Write(head); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	var d *directlink.Writer
	var err error
	switch mode {
	case modeDial:
		d, err = rn.dialOffered(ctx, id, s)
	case modeListen:
		d, err = rn.acceptDialed(ctx, id, s, lst)
	}
	if d != nil {
		rn.direct.Add(1)
		watchWriter(s, d)
	}
	return d, err
}

// receiveLink runs the receiver's side of the mode read from s: the
// direct link the frames come over, or nil for the stream.
func (rn *Service) receiveLink(s network.Stream, mode byte) (*directlink.Reader, error) {
	var d *directlink.Reader
	var err error
	switch mode {
	case modeStream:
		return nil, nil
	case modeDial:
		d, err = rn.offerLink(s)
	case modeListen:
		d, err = rn.dialLink(s)
	default:
		return nil, fmt.Errorf("unknown stream mode %d", mode)
	}
	if d != nil {
		rn.direct.Add(1)
		watchReader(s, d)
	}
	return d, err
}
