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
// Trust comes from the stream that carries the offer: the receiver listens
// on an ephemeral port of the connection's local address and sends the port
// and a fresh random 256-bit key over the libp2p stream, which Noise (bound
// to the swarm key, when there is one) already keeps confidential and
// authenticated to the peer ID. Only that peer learns the key. The dialer's
// first record seals a fixed hello; the listener takes the first connection
// whose hello opens under the key and closes the port, so a stranger who
// finds the port learns nothing and cannot inject a frame. Each record's
// nonce is its index (a key seals one connection's records, never two), so
// a replayed, reordered, dropped or altered record fails to open, and the
// plaintext length is authenticated data of its record.
//
// Wire format of a record: the plaintext length n (4 bytes, little-endian),
// then AES-256-GCM(key, nonce = 4 zero bytes ‖ index as 8 bytes big-endian,
// plaintext, additional data = the 4 length bytes): n + 16 bytes.
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
	"time"
)

// KeySize is the length of a link's AES-256 key.
const KeySize = 32

// OfferSize is the length of an encoded offer: the port (2 bytes,
// big-endian) and the key.
const OfferSize = 2 + KeySize

// HelloTimeout bounds how long the listener waits for a connection's hello.
const HelloTimeout = 5 * time.Second

// hello is the plaintext of a dialer's first record.
var hello = []byte("p2ptrain direct link v1")

// ErrFrameTooLarge is wrapped by a read of a record whose length exceeds
// the reader's maximum; nothing is allocated for it.
var ErrFrameTooLarge = errors.New("directlink: frame too large")

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

func (s *sealer) next() []byte {
	binary.BigEndian.PutUint64(s.nonce[4:], s.index)
	s.index++
	return s.nonce[:]
}

// Listener waits for the one connection its offer admits.
type Listener struct {
	ln  *net.TCPListener
	key [KeySize]byte
}

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

// Accept returns a Reader of the first connection whose hello opens under
// the key, closing every other connection and then the listener. Frames
// above maxFrame bytes are refused. It fails when ctx ends or the listener
// is closed.
func (l *Listener) Accept(ctx context.Context, maxFrame int) (*Reader, error) {
	defer l.ln.Close()
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	aead, err := newAEAD(l.key[:])
	if err != nil {
		return nil, err
	}
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			}
			return nil, fmt.Errorf("directlink: accept: %w", err)
		}
		r := &Reader{c: c, open: sealer{aead: aead}, max: maxFrame}
		deadline := time.Now().Add(HelloTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		if err := r.readHello(deadline); err != nil {
			c.Close() // not the peer the key was sent to
			continue
		}
		return r, nil
	}
}

// Dial connects to the listener of offer at ip and sends the hello.
func Dial(ctx context.Context, ip net.IP, offer []byte) (*Writer, error) {
	if len(offer) != OfferSize {
		return nil, fmt.Errorf("directlink: offer of %d bytes, want %d", len(offer), OfferSize)
	}
	aead, err := newAEAD(offer[2:])
	if err != nil {
		return nil, err
	}
	addr := &net.TCPAddr{IP: ip, Port: int(binary.BigEndian.Uint16(offer))}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, fmt.Errorf("directlink: dial %s: %w", addr, err)
	}
	w := &Writer{c: c, seal: sealer{aead: aead}}
	if err := w.WriteFrame(hello); err != nil {
		c.Close()
		return nil, fmt.Errorf("directlink: hello to %s: %w", addr, err)
	}
	return w, nil
}

// Writer seals frames onto a direct link. It is not safe for concurrent use.
type Writer struct {
	c    net.Conn
	seal sealer
	buf  []byte
}

// WriteFrame writes frame as one record in one write.
func (w *Writer) WriteFrame(frame []byte) error {
	if uint64(len(frame)) > 1<<32-1-16 {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(frame))
	}
	var ad [4]byte
	binary.LittleEndian.PutUint32(ad[:], uint32(len(frame)))
	w.buf = append(w.buf[:0], ad[:]...)
	w.buf = w.seal.aead.Seal(w.buf, w.seal.next(), frame, ad[:])
	_, err := w.c.Write(w.buf)
	return err
}

// Close closes the connection. Records already written are still
// delivered: the receiver never writes, so the kernel sends them, then the
// end of the stream.
func (w *Writer) Close() error { return w.c.Close() }

// Reader opens the frames of a direct link. It is not safe for concurrent
// use, except Close.
type Reader struct {
	c    net.Conn
	open sealer
	max  int
	buf  []byte
}

// readHello reads and checks the dialer's first record by deadline.
func (r *Reader) readHello(deadline time.Time) error {
	if err := r.c.SetReadDeadline(deadline); err != nil {
		return err
	}
	max := r.max
	r.max = len(hello)
	got, err := r.ReadFrameInto(func(n int) []byte { return make([]byte, n) })
	r.max = max
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(got, hello) != 1 {
		return errors.New("directlink: not a hello")
	}
	return r.c.SetReadDeadline(time.Time{})
}

// ReadFrameInto reads the next record and opens it into alloc(n), n being
// its plaintext length (at most the maximum, checked before alloc is
// called). A record that fails to open is an error: the link must then be
// closed.
func (r *Reader) ReadFrameInto(alloc func(n int) []byte) ([]byte, error) {
	var ad [4]byte
	if _, err := io.ReadFull(r.c, ad[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(ad[:])
	if r.max < 0 || uint64(n) > uint64(r.max) {
		return nil, fmt.Errorf("%w: length %d > max %d", ErrFrameTooLarge, n, r.max)
	}
	sealed := int(n) + r.open.aead.Overhead()
	if cap(r.buf) < sealed {
		r.buf = make([]byte, sealed)
	}
	r.buf = r.buf[:sealed]
	if _, err := io.ReadFull(r.c, r.buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	frame := alloc(int(n))
	out, err := r.open.aead.Open(frame[:0], r.open.next(), r.buf, ad[:])
	if err != nil {
		return nil, fmt.Errorf("directlink: record %d does not open: %w", r.open.index-1, err)
	}
	return out, nil
}

// Close closes the connection; a blocked read returns an error.
func (r *Reader) Close() error { return r.c.Close() }
