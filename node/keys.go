package node

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// WriteSwarmKey creates a new private-network key (libp2p PSK v1 format) at
// path with mode 0600. It refuses to overwrite an existing file.
func WriteSwarmKey(path string) error {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return fmt.Errorf("node: generate swarm key: %w", err)
	}
	data := "/key/swarm/psk/1.0.0/\n/base16/\n" + hex.EncodeToString(k[:]) + "\n"
	return writeNew(path, []byte(data))
}

// LoadSwarmKey reads a private-network key file. Like ssh with a private
// key, it refuses a file that other users may read or write: whoever reads
// the key is a member of the cluster. A base16 key must be exactly 64 hex
// digits (libp2p's decoder reads the first 32 bytes and ignores the rest,
// so a mangled key would quietly be another key).
func LoadSwarmKey(path string) (pnet.PSK, error) {
	b, err := readPrivate(path, "swarm key", "anyone who reads it can join the cluster")
	if err != nil {
		return nil, err
	}
	bad := func(why string) error {
		return fmt.Errorf("node: swarm key %s is not a libp2p PSK v1 key (make one with `p2ptrain keygen --swarm-key FILE`): %s", path, why)
	}
	lines := strings.SplitN(string(b), "\n", 3)
	if len(lines) == 3 && strings.TrimSpace(lines[1]) == "/base16/" {
		key := strings.TrimRight(lines[2], " \t\r\n")
		if strings.ContainsAny(key, "\n") {
			return nil, bad("more than one line after /base16/")
		}
		if len(key) != 64 {
			return nil, bad(fmt.Sprintf("its key has %d characters, want 64 hex digits (32 bytes)", len(key)))
		}
		if _, err := hex.DecodeString(key); err != nil {
			return nil, bad(fmt.Sprintf("its key is not hex: %v", err))
		}
	}
	psk, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil {
		return nil, bad(err.Error())
	}
	return psk, nil
}

// readPrivate reads a key file that must be a regular file no other user
// may read or write (what: its kind; risk: what a reader could do).
func readPrivate(path, what, risk string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("node: read %s: %w", what, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("node: %s %s is not a regular file (%s)", what, path, fi.Mode().Type())
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("node: %s %s has mode %#o, open to other users: %s (run chmod 600 %s)", what, path, m, risk, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node: read %s: %w", what, err)
	}
	return b, nil
}

// WriteIdentity creates a new Ed25519 identity at path with mode 0600 and
// returns its peer ID. It refuses to overwrite an existing file.
func WriteIdentity(path string) (peer.ID, error) {
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("node: generate identity: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(priv)
	if err != nil {
		return "", fmt.Errorf("node: encode identity: %w", err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		return "", fmt.Errorf("node: derive peer ID: %w", err)
	}
	return id, writeNew(path, b)
}

// LoadIdentity reads an identity written by WriteIdentity; like
// LoadSwarmKey, it refuses a file other users may read or write.
func LoadIdentity(path string) (crypto.PrivKey, error) {
	b, err := readPrivate(path, "identity", "anyone who reads it can act as this peer")
	if err != nil {
		return nil, err
	}
	priv, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("node: identity %s is not a libp2p private key (make one with `p2ptrain keygen --identity FILE`): %w", path, err)
	}
	return priv, nil
}

func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("node: %s already exists; refusing to overwrite a key", path)
	}
	if err != nil {
		return fmt.Errorf("node: create %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("node: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("node: write %s: %w", path, err)
	}
	return nil
}
