// Package directlink is a one-way link for bulk frames over a TCP connection
// of its own, sealed with AES-256-GCM, beside an authenticated libp2p stream
// that carries its offer.
//
// Every byte of an all-reduce crosses the libp2p stack several times: the
// muxer copies it into its frame, the secure channel into its record (and
// seals it with ChaCha20-Poly1305), and on the way in the secure channel,
// the muxer's buffer and the stream's reader copy it again. A direct link
// seals each frame once, from the caller's buffer into the record that goes
// to the socket in one write, and opens it once, from the socket's record
// into the caller's frame buffer, with a cipher that x86's AES instructions
// run about 1.8× faster than ChaCha20-Poly1305 on the machines measured
// (README, "Speed").
//
// Trust comes from the stream that carries the offer: one end listens on an
// ephemeral port of the connection's local address and sends the port and
// a fresh random 256-bit key over the libp2p stream, which Noise (bound to
// the swarm key, when there is one) already keeps confidential and
// authenticated to the peer ID. Only that peer learns the key. The dialer's
// first record seals a fixed hello; the listener takes the first connection
// whose hello opens under the key and closes the port, so a stranger who
// finds the port learns nothing and cannot inject a frame. Hellos are read
// concurrently (at most MaxPendingHellos at once, each within HelloTimeout),
// so a stranger holding a connection open does not delay the peer's, and
// with ExpectFrom only from the peer's address.
//
// Either end may carry the frames: the dialer (Dial, Listener.Accept) or the
// listener (Listener.AcceptWriter, DialReader). Which end listens is the
// caller's choice; the all-reduce lets the end that accepted the libp2p
// connection listen, as that address reached it once already, so a peer
// behind a NAT dials out.
//
// Each record's nonce is its direction (4 bytes: 0 from the dialer, 1 from
// the listener) and its index in that direction (8 bytes, big-endian; the
// dialer's hello is its record 0). A key seals one connection's records,
// never two, so no nonce repeats under a key, and a replayed, reordered,
// dropped, reflected or altered record fails to open. The plaintext length
// is authenticated data of its record.
//
// Wire format of a record: the plaintext length n (4 bytes, little-endian),
// then AES-256-GCM(key, nonce, plaintext, additional data = the 4 length
// bytes): n + 16 bytes.
package directlink

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// KeySize is the length of a link's AES-256 key.
const KeySize = 32

// Overhead is what a record adds to its frame besides the length: the
// AES-GCM tag.
const Overhead = 16

// OfferSize is the length of an encoded offer: the port (2 bytes,
// big-endian) and the key.
const OfferSize = 2 + KeySize

// HelloTimeout bounds how long the listener waits for a connection's hello.
const HelloTimeout = 5 * time.Second

// MaxPendingHellos bounds the connections whose hellos a listener reads at
// once; it closes further ones unread until one of them is done.
const MaxPendingHellos = 16

// MinPort is the lowest port an offer may name: a listener's ephemeral port
// is never a privileged one, so an offer of one is refused unread rather
// than dialed.
const MinPort = 1024

// hello is the plaintext of a dialer's first record.
var hello = []byte("p2ptrain direct link v1")

// ErrFrameTooLarge is wrapped by a read of a record whose length exceeds
// the reader's maximum; nothing is allocated for it.
var ErrFrameTooLarge = errors.New("directlink: frame too large")

// ErrBadRecord is wrapped by a read of a record that does not open under
// the key at its index: altered, replayed, reordered or forged.
var ErrBadRecord = errors.New("directlink: record does not open")

// Record directions: the first 4 bytes of a nonce.
const (
	fromDialer   uint32 = 0
	fromListener uint32 = 1
)

// newAEAD returns AES-256-GCM under key.
func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("directlink: %w", err)
	}
	return cipher.NewGCM(block)
}

// sealer numbers the records of one direction.
type sealer struct {
	aead  cipher.AEAD
	index uint64
	nonce [12]byte
}

func newSealer(aead cipher.AEAD, direction uint32) sealer {
	s := sealer{aead: aead}
	binary.BigEndian.PutUint32(s.nonce[:4], direction)
	return s
}

func (s *sealer) next() []byte {
	binary.BigEndian.PutUint64(s.nonce[4:], s.index)
	s.index++
	return s.nonce[:]
}

// Listener waits for the one connection its offer admits.
type Listener struct {
	ln   *net.TCPListener
	key  [KeySize]byte
	from net.IP // the only address connections are taken from (nil: any)
}

// ExpectFrom makes the listener close unread every connection that does
// not come from ip (the address the peer's libp2p connection came from),
// so that strangers elsewhere cannot fill its hello slots. Call it before
// Accept.
func (l *Listener) ExpectFrom(ip net.IP) { l.from = ip }

// Listen opens a listener on an ephemeral TCP port of ip with a fresh key.
func Listen(ip net.IP) (*Listener, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
	if err != nil {
		return nil, fmt.Errorf("directlink: listen on %s: %w", ip, err)
	}
	l := &Listener{ln: ln}
	if _, err := rand.Read(l.key[:]); err != nil {
		ln.Close()
		return nil, fmt.Errorf("directlink: draw a key: %w", err)
	}
	return l, nil
}

// Offer returns the offer to send over the authenticated stream.
func (l *Listener) Offer() []byte {
	b := binary.BigEndian.AppendUint16(make([]byte, 0, OfferSize), uint16(l.ln.Addr().(*net.TCPAddr).Port))
	return append(b, l.key[:]...)
}

// Close stops listening; a waiting Accept returns an error.
func (l *Listener) Close() error { return l.ln.Close() }

// Accept returns a Reader of the frames the dialer writes, on the first
// connection whose hello opens under the key, closing every other
// connection and then the listener. Frames above maxFrame bytes are
// refused. It fails when ctx ends or the listener is closed.
func (l *Listener) Accept(ctx context.Context, maxFrame int) (*Reader, error) {
	c, aead, err := l.accept(ctx)
	if err != nil {
		return nil, err
	}
	open := newSealer(aead, fromDialer)
	open.index = 1 // record 0 was the hello
	return newReader(c, open, maxFrame), nil
}

// AcceptWriter is Accept for a link on which the listener writes the
// frames and the dialer (DialReader) reads them.
func (l *Listener) AcceptWriter(ctx context.Context) (*Writer, error) {
	c, aead, err := l.accept(ctx)
	if err != nil {
		return nil, err
	}
	return &Writer{c: c, seal: newSealer(aead, fromListener)}, nil
}

// accept returns the first connection whose hello opens under the key, the
// hello read, with the key's cipher.
func (l *Listener) accept(ctx context.Context) (net.Conn, cipher.AEAD, error) {
	defer l.ln.Close()
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	aead, err := newAEAD(l.key[:])
	if err != nil {
		return nil, nil, err
	}
	deadline := func() time.Time {
		d := time.Now().Add(HelloTimeout)
		if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
			return cd
		}
		return d
	}
	// Every connection's hello is read on a goroutine of its own; the
	// first that opens wins, and the others are closed (done closes any
	// still reading, whose goroutines then end).
	won := make(chan net.Conn, 1)
	done := make(chan struct{})
	slots := make(chan struct{}, MaxPendingHellos)
	var reading []net.Conn // every connection read, the winner's too
	var winner net.Conn
	defer func() {
		close(done)
		for _, c := range reading {
			if c != winner {
				c.Close()
			}
		}
	}()
	accepted := make(chan net.Conn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := l.ln.AcceptTCP()
			if err != nil {
				acceptErr <- err
				return
			}
			select {
			case accepted <- c:
			case <-done:
				c.Close()
				return
			}
		}
	}()
	for {
		select {
		case winner = <-won:
			return winner, aead, nil
		case err := <-acceptErr:
			select {
			case winner = <-won: // a hello opened just before the listener closed
				return winner, aead, nil
			default:
			}
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			}
			return nil, nil, fmt.Errorf("directlink: accept: %w", err)
		case c := <-accepted:
			if ta, ok := c.RemoteAddr().(*net.TCPAddr); l.from != nil && (!ok || !ta.IP.Equal(l.from)) {
				c.Close() // not from the peer's address
				continue
			}
			select {
			case slots <- struct{}{}:
			default:
				c.Close() // too many strangers at once
				continue
			}
			reading = append(reading, c)
			go func(c net.Conn, by time.Time) {
				defer func() { <-slots }()
				if err := readHello(c, aead, by); err != nil {
					c.Close() // not the peer the key was sent to
					return
				}
				select {
				case won <- c:
				default:
					c.Close() // a second connection with the key: one link only
				}
			}(c, deadline())
		}
	}
}

// readHello reads and checks a dialer's first record by deadline.
func readHello(c net.Conn, aead cipher.AEAD, deadline time.Time) error {
	if err := c.SetReadDeadline(deadline); err != nil {
		return err
	}
	r := newReader(c, newSealer(aead, fromDialer), len(hello))
	got, err := r.ReadFrameInto(func(n int) []byte { return make([]byte, n) })
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(got, hello) != 1 {
		return errors.New("directlink: not a hello")
	}
	return c.SetReadDeadline(time.Time{})
}

// Dial connects to the listener of offer at ip and sends the hello; the
// Writer's frames are read by the listener's Accept.
func Dial(ctx context.Context, ip net.IP, offer []byte) (*Writer, error) {
	w, _, err := dial(ctx, ip, offer)
	return w, err
}

// DialReader is Dial for a link on which the listener (AcceptWriter)
// writes the frames: a Reader of them, frames above maxFrame bytes refused.
func DialReader(ctx context.Context, ip net.IP, offer []byte, maxFrame int) (*Reader, error) {
	w, aead, err := dial(ctx, ip, offer)
	if err != nil {
		return nil, err
	}
	return newReader(w.c, newSealer(aead, fromListener), maxFrame), nil
}

// dial connects to the listener of offer at ip and sends the hello: the
// dialer's Writer (its next record is number 1) and the key's cipher.
func dial(ctx context.Context, ip net.IP, offer []byte) (*Writer, cipher.AEAD, error) {
	if len(offer) != OfferSize {
		return nil, nil, fmt.Errorf("directlink: offer of %d bytes, want %d", len(offer), OfferSize)
	}
	port := int(binary.BigEndian.Uint16(offer))
	if port < MinPort {
		return nil, nil, fmt.Errorf("directlink: offer names port %d, below %d", port, MinPort)
	}
	aead, err := newAEAD(offer[2:])
	if err != nil {
		return nil, nil, err
	}
	addr := &net.TCPAddr{IP: ip, Port: port}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, nil, fmt.Errorf("directlink: dial %s: %w", addr, err)
	}
	w := &Writer{c: c, seal: newSealer(aead, fromDialer)}
	if err := w.WriteFrame(hello); err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("directlink: hello to %s: %w", addr, err)
	}
	return w, aead, nil
}

// Writer seals frames onto a direct link. It is not safe for concurrent
// use, except Close and CloseWith.
type Writer struct {
	c     net.Conn
	seal  sealer
	buf   []byte
	cause cause
	streamEnd
}

// streamEnd delivers, once, how the libp2p stream beside a link ended
// (nil: gracefully); its channel is nil when no stream watches the link.
type streamEnd struct {
	side chan error
}

// StreamEnd waits up to wait for the end of the libp2p stream beside the
// link (a Broker's links have one) and returns how it ended: nil when the
// peer closed it, its error otherwise (a reset by the peer is a
// *network.StreamError). ended is false when it did not end within wait
// or the link has no stream beside it. A link's end alone cannot tell a
// peer that closed its epoch from one that reset it (the two travel on
// different connections): call this after a read or write fails to learn
// which.
func (e *streamEnd) StreamEnd(wait time.Duration) (ended bool, err error) {
	if e.side == nil {
		return false, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-e.side:
		e.side <- err // for a later call
		return true, err
	case <-t.C:
		return false, nil
	}
}

// cause is why a link was closed (CloseWith), reported by the reads and
// writes that the close broke.
type cause struct {
	mu  sync.Mutex
	err error
}

func (c *cause) set(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

// wrap returns err, or the recorded cause when there is one.
func (c *cause) wrap(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("directlink: link closed: %w", c.err)
	}
	return err
}

// WriteFrame writes frame as one record in one write.
func (w *Writer) WriteFrame(frame []byte) error {
	if uint64(len(frame)) > 1<<32-1-Overhead {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(frame))
	}
	var ad [4]byte
	binary.LittleEndian.PutUint32(ad[:], uint32(len(frame)))
	w.buf = append(w.buf[:0], ad[:]...)
	w.buf = w.seal.aead.Seal(w.buf, w.seal.next(), frame, ad[:])
	if _, err := w.c.Write(w.buf); err != nil {
		return w.cause.wrap(err)
	}
	return nil
}

// SetWriteDeadline bounds the writes in progress and to come.
func (w *Writer) SetWriteDeadline(t time.Time) error { return w.c.SetWriteDeadline(t) }

// Close closes the connection. Records already written are still
// delivered: the reading end writes nothing after its hello, so the kernel
// sends them, then the end of the stream.
func (w *Writer) Close() error { return w.c.Close() }

// CloseWith is Close, and a write that the close breaks, or any later
// one, returns an error wrapping why.
func (w *Writer) CloseWith(why error) error {
	w.cause.set(why)
	return w.c.Close()
}

// Reader opens the frames of a direct link. It is not safe for concurrent
// use, except Close.
type Reader struct {
	c     net.Conn
	in    *filler // nil: reads go through c
	open  sealer
	max   int
	buf   []byte
	cause cause
	streamEnd
}

// newReader returns a Reader of c's records opened by open, frames above
// maxFrame refused.
func newReader(c net.Conn, open sealer, maxFrame int) *Reader {
	return &Reader{c: c, in: newFiller(c), open: open, max: maxFrame}
}

// readFull reads exactly len(buf) bytes (io.EOF when none came).
func (r *Reader) readFull(buf []byte) error {
	if r.in != nil {
		return r.in.fill(buf)
	}
	_, err := io.ReadFull(r.c, buf)
	return err
}

// SetMaxFrame sets the largest frame the reader takes (a frame above it is
// refused before anything is allocated). Call it before reading.
func (r *Reader) SetMaxFrame(n int) { r.max = n }

// ReadFrameInto reads the next record and opens it into alloc(n), n being
// its plaintext length (at most the maximum, checked before alloc is
// called); a buffer with Overhead bytes of spare capacity is read into
// and opened in place. A record that fails to open is an error: the link
// must then be closed.
func (r *Reader) ReadFrameInto(alloc func(n int) []byte) ([]byte, error) {
	var ad [4]byte
	if err := r.readFull(ad[:]); err != nil {
		return nil, r.cause.wrap(err)
	}
	n := binary.LittleEndian.Uint32(ad[:])
	if r.max < 0 || uint64(n) > uint64(r.max) {
		return nil, fmt.Errorf("%w: length %d > max %d", ErrFrameTooLarge, n, r.max)
	}
	sealed := int(n) + Overhead
	// Opened in place when the caller's buffer has room for the tag
	// (alloc returning n bytes with Overhead more capacity), else from the
	// reader's own buffer.
	frame := alloc(int(n))
	buf := frame[:0]
	if cap(frame) >= sealed {
		buf = frame[:sealed]
	} else {
		if cap(r.buf) < sealed {
			r.buf = make([]byte, sealed)
		}
		buf = r.buf[:sealed]
	}
	if err := r.readFull(buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, r.cause.wrap(err)
	}
	out, err := r.open.aead.Open(frame[:0], r.open.next(), buf, ad[:])
	if err != nil {
		return nil, fmt.Errorf("%w: record %d: %w", ErrBadRecord, r.open.index-1, err)
	}
	return out, nil
}

// Close closes the connection; a blocked read returns an error.
func (r *Reader) Close() error { return r.c.Close() }

// CloseWith is Close, and the read that the close breaks, or any later
// one, returns an error wrapping why.
func (r *Reader) CloseWith(why error) error {
	r.cause.set(why)
	return r.c.Close()
}
