package node

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"go.uber.org/zap"
)

// With a swarm key and node.swarm_key_mode = "noise" (the default) the key
// is bound into every connection's Noise handshake instead of encrypting
// the connection a second time (libp2p's private network, "pnet"): both
// sides set the handshake's prologue to a value derived from the key. The
// prologue is never sent, but Noise hashes it into the handshake
// transcript that authenticates every handshake message, so a peer without
// the key, or with another, fails the handshake: the dialer of a keyed
// peer cannot authenticate its reply, and a keyed peer cannot authenticate
// the dialer's last message. Noise's ChaCha20-Poly1305 then encrypts the
// connection once. docs/protocols.md compares the two modes.

// prologueInfo labels the HKDF derivation of the Noise prologue, so the
// prologue is not the key itself and no other use of the key yields it.
const prologueInfo = "p2ptrain/swarm-key/noise-prologue/v1"

// swarmKeyPrologue returns the Noise prologue of a swarm key: 32 bytes of
// HKDF-SHA256 of the key with prologueInfo.
func swarmKeyPrologue(psk pnet.PSK) ([]byte, error) {
	if len(psk) == 0 {
		return nil, errors.New("node: empty swarm key")
	}
	p, err := hkdf.Key(sha256.New, psk, nil, prologueInfo, 32)
	if err != nil {
		return nil, fmt.Errorf("node: derive the Noise prologue from the swarm key: %w", err)
	}
	return p, nil
}

// pskNoise is Noise with the swarm key's prologue (a sec.SecureTransport);
// it turns handshake failures that mean "not this swarm key" into errors
// and log lines that say so.
type pskNoise struct {
	st  *noise.SessionTransport
	log *zap.Logger
	// warned limits the inbound refusals logged at warn level to one per
	// remote IP per refusalLogEvery; later ones go to debug.
	mu     sync.Mutex
	warned map[string]time.Time
}

// refusalLogEvery is how often one remote IP's refused handshakes are
// logged at warn level (a scanner must not flood the log).
const refusalLogEvery = time.Minute

// ErrSwarmKeyMismatch marks a connection refused because the other side
// does not hold this peer's swarm key (it holds another, or none).
var ErrSwarmKeyMismatch = errors.New("the peer does not hold this cluster's swarm key (it has another key, or none)")

// newPSKNoise returns the libp2p security constructor of Noise with the
// swarm key's prologue, for libp2p.Security(noise.ID, ...).
func newPSKNoise(psk pnet.PSK, log *zap.Logger) (func(protocol.ID, crypto.PrivKey, []tptu.StreamMuxer) (*pskNoise, error), error) {
	prologue, err := swarmKeyPrologue(psk)
	if err != nil {
		return nil, err
	}
	return func(id protocol.ID, key crypto.PrivKey, muxers []tptu.StreamMuxer) (*pskNoise, error) {
		t, err := noise.New(id, key, muxers)
		if err != nil {
			return nil, fmt.Errorf("node: noise transport: %w", err)
		}
		st, err := t.WithSessionOptions(noise.Prologue(prologue))
		if err != nil {
			return nil, fmt.Errorf("node: noise transport with the swarm key: %w", err)
		}
		return &pskNoise{st: st, log: log, warned: map[string]time.Time{}}, nil
	}, nil
}

var _ sec.SecureTransport = (*pskNoise)(nil)

// ID is Noise's protocol ID: a peer without the key that offers Noise
// negotiates it and then fails the handshake, which both sides can name.
func (t *pskNoise) ID() protocol.ID { return t.st.ID() }

// SecureOutbound runs the handshake as the initiator. A reply that fails
// authentication comes from a peer without this swarm key.
func (t *pskNoise) SecureOutbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	c, err := t.st.SecureOutbound(ctx, insecure, p)
	if err != nil && authFailed(err) {
		err = fmt.Errorf("node: Noise handshake with %s at %s: %w (%v)", p, insecure.RemoteAddr(), ErrSwarmKeyMismatch, err)
		t.log.Warn("refused a connection: the peer does not hold this cluster's swarm key",
			zap.Stringer("peer", p), zap.Stringer("addr", insecure.RemoteAddr()))
	}
	return c, err
}

// SecureInbound runs the handshake as the responder. A last handshake
// message that fails authentication, or none at all after this peer's
// reply (a dialer without the key cannot authenticate that reply and
// hangs up), comes from a peer without this swarm key.
func (t *pskNoise) SecureInbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	c, err := t.st.SecureInbound(ctx, insecure, p)
	if err != nil && (authFailed(err) || strings.Contains(err.Error(), "error reading handshake message")) {
		t.refused(insecure.RemoteAddr(), err)
		err = fmt.Errorf("node: Noise handshake from %s: %w (%v)", insecure.RemoteAddr(), ErrSwarmKeyMismatch, err)
	}
	return c, err
}

// refused logs an inbound handshake refused for the swarm key: at warn
// level once per remote IP per refusalLogEvery, else at debug.
func (t *pskNoise) refused(addr net.Addr, err error) {
	host := addr.String()
	if h, _, splitErr := net.SplitHostPort(host); splitErr == nil {
		host = h
	}
	now := time.Now()
	t.mu.Lock()
	last, seen := t.warned[host]
	warn := !seen || now.Sub(last) >= refusalLogEvery
	if warn {
		if len(t.warned) >= 1024 { // bounded: forget everyone rather than grow
			clear(t.warned)
		}
		t.warned[host] = now
	}
	t.mu.Unlock()
	msg := "refused a connection: the dialer failed the Noise handshake bound to the swarm key (it holds another key, or none)"
	if warn {
		t.log.Warn(msg, zap.Stringer("addr", addr), zap.Error(err))
	} else {
		t.log.Debug(msg, zap.Stringer("addr", addr), zap.Error(err))
	}
}

// authFailed reports whether err is an AEAD authentication failure of a
// Noise handshake message (a different prologue gives exactly that).
func authFailed(err error) bool {
	return strings.Contains(err.Error(), "message authentication failed")
}
