package node

import (
	"crypto/aes"
	"crypto/cipher"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

// BenchmarkRecordCipher seals one full Noise record (65,535 bytes with its
// 16-byte tag) with the cipher libp2p's Noise uses (ChaCha20-Poly1305) and,
// for comparison, with AES-GCM, which a hardware-accelerated secure channel
// could use instead: the floor that encryption puts under a daemon's CPU
// per byte (README, "Speed"; a ring all-reduce seals and opens
// 2·(W−1)/W bytes each per byte all-reduced).
func BenchmarkRecordCipher(b *testing.B) {
	newGCM := func(keyLen int) func() (cipher.AEAD, error) {
		return func() (cipher.AEAD, error) {
			c, err := aes.NewCipher(make([]byte, keyLen))
			if err != nil {
				return nil, err
			}
			return cipher.NewGCM(c)
		}
	}
	for _, tc := range []struct {
		name string
		new  func() (cipher.AEAD, error)
	}{
		{"chacha20poly1305", func() (cipher.AEAD, error) { return chacha20poly1305.New(make([]byte, chacha20poly1305.KeySize)) }},
		{"aes128gcm", newGCM(16)},
		{"aes256gcm", newGCM(32)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			a, err := tc.new()
			if err != nil {
				b.Fatal(err)
			}
			msg := make([]byte, 65535-a.Overhead())
			out := make([]byte, 0, 65535)
			nonce := make([]byte, a.NonceSize())
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				out = a.Seal(out[:0], nonce, msg, nil)
			}
		})
	}
}
