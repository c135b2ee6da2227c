package directlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"go.uber.org/zap"
)

// Broker negotiates the direct links of one libp2p protocol's streams: the
// opener of a stream writes the protocol's hello and a mode byte (Open),
// the receiver reads the hello and calls Receive, and both run the mode's
// exchange on the stream (docs/protocols.md has the bytes). The end that
// accepted the libp2p connection listens and the other dials: that end's
// address reached it once already, so a peer behind a NAT dials out. An
// end that saw a link with a peer fail neither asks for nor dials one with
// it for FailTTL. Create it with NewBroker.
type Broker struct {
	// Dial and DialReader open links (the package's Dial and DialReader;
	// tests replace them).
	Dial       func(ctx context.Context, ip net.IP, offer []byte) (*Writer, error)
	DialReader func(ctx context.Context, ip net.IP, offer []byte, maxFrame int) (*Reader, error)
	// AcceptTimeout bounds the listening end's wait for the dial.
	AcceptTimeout time.Duration

	log   *zap.Logger
	links atomic.Uint64

	mu     sync.Mutex
	off    bool                  // never ask for or offer direct links
	failed map[peer.ID]time.Time // when a direct link with the peer failed
}

// Inbound is the incoming side of a stream whose link a Broker negotiated:
// the stream, and the direct link its frames come over (nil: they come on
// the stream).
type Inbound struct {
	Stream network.Stream
	Link   *Reader
}

// Reset breaks the stream and the link.
func (in Inbound) Reset() {
	in.Stream.Reset() // first: the peer's watcher learns it was a reset
	if in.Link != nil {
		in.Link.Close()
	}
}

// Timeouts of the negotiation.
const (
	// AnswerTimeout bounds each read of an answer on the stream.
	AnswerTimeout = 10 * time.Second
	// DialTimeout bounds the dialing end's dial of a link.
	DialTimeout = 2 * time.Second
	// FailTTL is how long a peer whose link failed is sent frames over
	// streams before the next try.
	FailTTL = 10 * time.Minute
)

// NewBroker returns a Broker with direct links on.
func NewBroker(log *zap.Logger) *Broker {
	if log == nil {
		log = zap.NewNop()
	}
	return &Broker{Dial: Dial, DialReader: DialReader, AcceptTimeout: 10 * time.Second, log: log,
		failed: map[peer.ID]time.Time{}}
}

// SetEnabled turns direct links on or off: off, frames always go over the
// streams, and a peer asking for a direct link is told to send them there.
func (br *Broker) SetEnabled(on bool) {
	br.mu.Lock()
	br.off = !on
	br.mu.Unlock()
}

// Links returns how many direct links were opened, as opener or receiver.
func (br *Broker) Links() uint64 { return br.links.Load() }

// enabled says whether direct links may be used.
func (br *Broker) enabled() bool {
	br.mu.Lock()
	defer br.mu.Unlock()
	return !br.off
}

// Stream modes (the byte after the hello) and the answers on the stream.
const (
	modeStream byte = 0 // the frames follow on the stream
	modeDial   byte = 1 // the receiver offers a direct link, the opener dials it
	modeListen byte = 2 // the opener offers a direct link, the receiver dials it

	answerNo  byte = 0
	answerYes byte = 1
)

// TCPIP returns the IP address of a TCP multiaddr (nil: not IP and TCP).
func TCPIP(a ma.Multiaddr) net.IP {
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
	return !c.Stat().Limited && TCPIP(c.LocalMultiaddr()) != nil && TCPIP(c.RemoteMultiaddr()) != nil
}

// linkFailed records that a direct link with peer id failed: this end
// neither asks for nor dials one with it for FailTTL.
func (br *Broker) linkFailed(id peer.ID, err error) {
	br.log.Info("direct link failed; frames go over the libp2p stream", zap.Stringer("peer", id), zap.Error(err))
	now := time.Now()
	br.mu.Lock()
	for p, at := range br.failed {
		if now.Sub(at) > FailTTL {
			delete(br.failed, p)
		}
	}
	br.failed[id] = now
	br.mu.Unlock()
}

// directAllowed says whether a direct link with peer id over s may be
// tried: direct links on, s's connection capable, and no failure with the
// peer within FailTTL.
func (br *Broker) directAllowed(id peer.ID, s network.Stream) bool {
	if !directCapable(s) {
		return false
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.off {
		return false
	}
	at, failed := br.failed[id]
	return !failed || time.Since(at) > FailTTL
}

// openMode returns the mode the opener of s asks peer id for. The end that
// accepted the libp2p connection listens: the other end reached that
// address once already, so a peer behind a NAT dials out rather than
// waiting for a dial that its NAT drops.
func (br *Broker) openMode(id peer.ID, s network.Stream) byte {
	switch {
	case !br.directAllowed(id, s):
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

// watchReader closes d when s is reset or its connection lost, with the
// stream's error as the cause its reads report (a reset by the peer
// stays a *network.StreamError). The end of the stream (the opener closed
// it after its last frame) does not: frames may still wait in the link.
func watchReader(s network.Stream, d *Reader) {
	_ = s.SetReadDeadline(time.Time{})
	d.side = make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, s)
		if err != nil {
			d.CloseWith(err)
		}
		d.side <- err
	}()
}

// watchWriter closes d when s's read side ends: a reset, a lost
// connection (the cause its writes report), or this end's Close. Records
// already written are still delivered.
func watchWriter(s network.Stream, d *Writer) {
	_ = s.SetReadDeadline(time.Time{})
	d.side = make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, s)
		why := err
		if why == nil {
			why = io.EOF
		}
		d.CloseWith(why)
		d.side <- err
	}()
}

// offerLink is the receiver's side of modeDial: it offers a direct link
// and waits for the opener's choice and its dial. It returns the link, or
// nil when the frames come on the stream.
func (br *Broker) offerLink(s network.Stream, maxFrame int) (*Reader, error) {
	var lst *Listener
	if br.enabled() && directCapable(s) {
		var err error
		if lst, err = Listen(TCPIP(s.Conn().LocalMultiaddr())); err != nil {
			br.log.Debug("no direct link offered", zap.Error(err))
		} else {
			lst.ExpectFrom(TCPIP(s.Conn().RemoteMultiaddr()))
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
	choice, err := readAnswer(s, time.Now().Add(AnswerTimeout+DialTimeout), "the opener's choice")
	if err != nil {
		return nil, err
	}
	if choice != answerYes {
		br.linkFailed(s.Conn().RemotePeer(), errors.New("the opener could not dial the offer"))
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), br.AcceptTimeout)
	d, err := lst.Accept(ctx, maxFrame)
	cancel()
	if ok, err := br.accepted(s.Conn().RemotePeer(), s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// accepted is the listening end's part once its listener returned
// acceptErr: it confirms the link on s, or says no when the dial reached
// something else (a NAT, a proxy) or nothing in time, which it records. It
// reports whether the link stands; when not, link is closed.
func (br *Broker) accepted(id peer.ID, s network.Stream, link io.Closer, acceptErr error) (bool, error) {
	if acceptErr != nil {
		br.linkFailed(id, fmt.Errorf("the dial did not arrive: %w", acceptErr))
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
func (br *Broker) dialLink(s network.Stream, maxFrame int) (*Reader, error) {
	offer := make([]byte, OfferSize)
	if _, err := io.ReadFull(s, offer); err != nil {
		return nil, fmt.Errorf("read the direct link's offer: %w", err)
	}
	id := s.Conn().RemotePeer()
	if !br.directAllowed(id, s) {
		if _, err := s.Write([]byte{answerNo}); err != nil {
			return nil, fmt.Errorf("answer the offer: %w", err)
		}
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), DialTimeout)
	d, err := br.DialReader(ctx, TCPIP(s.Conn().RemoteMultiaddr()), offer, maxFrame)
	cancel()
	if ok, err := br.dialed(id, s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// dialed is the dialing end's part once its dial returned dialErr: it
// answers on s (no after a failed dial, which it records) and after a yes
// reads the listening end's confirmation that its listener took the
// connection (a dial can reach a NAT or a proxy instead). It reports
// whether the link stands; when not, link is closed.
func (br *Broker) dialed(id peer.ID, s network.Stream, link io.Closer, dialErr error) (bool, error) {
	if dialErr != nil {
		br.linkFailed(id, dialErr)
		if _, err := s.Write([]byte{answerNo}); err != nil {
			return false, fmt.Errorf("answer the direct link: %w", err)
		}
		return false, nil
	}
	if _, err := s.Write([]byte{answerYes}); err != nil {
		link.Close()
		return false, fmt.Errorf("answer the direct link: %w", err)
	}
	ok, err := readAnswer(s, time.Now().Add(br.AcceptTimeout+AnswerTimeout), "the direct link's confirmation")
	if err != nil {
		link.Close()
		return false, err
	}
	if ok != answerYes {
		link.Close()
		br.linkFailed(id, errors.New("the listening end did not accept the connection"))
		return false, nil
	}
	return true, nil
}

// dialOffered is the opener's side of modeDial: it reads the receiver's
// answer, dials its offer and waits for its confirmation. It returns the
// link, or nil when the frames go on the stream (no offer, or the dial
// failed; the stream says which to the receiver).
func (br *Broker) dialOffered(ctx context.Context, id peer.ID, s network.Stream) (*Writer, error) {
	defer s.SetReadDeadline(time.Time{})
	answer, err := readAnswer(s, time.Now().Add(AnswerTimeout), "the answer to a direct link")
	if err != nil || answer != answerYes {
		return nil, err
	}
	offer := make([]byte, OfferSize)
	if _, err := io.ReadFull(s, offer); err != nil {
		return nil, fmt.Errorf("read the direct link's offer: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	d, err := br.Dial(dctx, TCPIP(s.Conn().RemoteMultiaddr()), offer)
	cancel()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr // the send was cancelled, not the dial refused
		}
	}
	if ok, err := br.dialed(id, s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// acceptDialed is the opener's side of modeListen, after its offer went
// out with the mode: it reads whether the receiver dialed, takes the
// connection and confirms it. It returns the link, or nil when the frames
// go on the stream.
func (br *Broker) acceptDialed(ctx context.Context, id peer.ID, s network.Stream, lst *Listener) (*Writer, error) {
	defer s.SetReadDeadline(time.Time{})
	answer, err := readAnswer(s, time.Now().Add(AnswerTimeout+DialTimeout), "the answer to a direct link")
	if err != nil {
		return nil, err
	}
	if answer != answerYes {
		br.linkFailed(id, errors.New("the receiver did not dial the offer"))
		return nil, nil
	}
	actx, cancel := context.WithTimeout(ctx, br.AcceptTimeout)
	d, err := lst.AcceptWriter(actx)
	cancel()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
	}
	if ok, err := br.accepted(id, s, d, err); !ok {
		return nil, err
	}
	return d, nil
}

// Open negotiates the frames' path on a new stream s to peer id: it
// writes head (the protocol's hello) and the mode, and runs the mode's
// exchange. It returns the direct link, or nil when the frames go on the
// stream; a failure of the stream is an error.
func (br *Broker) Open(ctx context.Context, id peer.ID, s network.Stream, head []byte) (*Writer, error) {
	mode := br.openMode(id, s)
	var lst *Listener
	if mode == modeListen {
		var err error
		if lst, err = Listen(TCPIP(s.Conn().LocalMultiaddr())); err != nil {
			br.log.Debug("no direct link offered", zap.Error(err))
			mode = modeStream
		} else {
			lst.ExpectFrom(TCPIP(s.Conn().RemoteMultiaddr()))
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
	var d *Writer
	var err error
	switch mode {
	case modeDial:
		d, err = br.dialOffered(ctx, id, s)
	case modeListen:
		d, err = br.acceptDialed(ctx, id, s, lst)
	}
	if d != nil {
		br.links.Add(1)
		watchWriter(s, d)
	}
	return d, err
}

// Receive reads the mode byte that follows the hello of an inbound stream
// s and runs the mode's exchange. It returns the direct link the frames
// come over (frames above maxFrame bytes refused), or nil for the stream.
func (br *Broker) Receive(s network.Stream, maxFrame int) (*Reader, error) {
	var mode [1]byte
	if _, err := io.ReadFull(s, mode[:]); err != nil {
		return nil, fmt.Errorf("read stream mode: %w", err)
	}
	var d *Reader
	var err error
	switch mode[0] {
	case modeStream:
		return nil, nil
	case modeDial:
		d, err = br.offerLink(s, maxFrame)
	case modeListen:
		d, err = br.dialLink(s, maxFrame)
	default:
		return nil, fmt.Errorf("unknown stream mode %d", mode[0])
	}
	if d != nil {
		br.links.Add(1)
		watchReader(s, d)
	}
	return d, err
}
