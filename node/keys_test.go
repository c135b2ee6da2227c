package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadSwarmKeyRefusesOpenModes: a key file other users can read or
// write is refused with the fix in the message; mode 0600 loads.
func TestLoadSwarmKeyRefusesOpenModes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	if err := WriteSwarmKey(path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSwarmKey(path); err != nil {
		t.Fatalf("mode 0600: %v", err)
	}
	for _, mode := range []os.FileMode{0o644, 0o604, 0o620} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadSwarmKey(path)
		if err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %#o: err = %v, want a refusal naming chmod 600", mode, err)
		}
	}
}

// TestLoadSwarmKeyRefusesMangledKeys: a base16 key of any length but 64
// hex digits, or with more after it, is refused naming what is wrong (the
// libp2p decoder alone took the first 32 bytes of a longer key); a
// directory is refused as one.
func TestLoadSwarmKeyRefusesMangledKeys(t *testing.T) {
	dir := t.TempDir()
	hex64 := strings.Repeat("0f", 32)
	for name, c := range map[string]struct{ body, want string }{
		"ok":              {"/key/swarm/psk/1.0.0/\n/base16/\n" + hex64 + "\n", ""},
		"ok, no newline":  {"/key/swarm/psk/1.0.0/\n/base16/\n" + hex64, ""},
		"ok, CRLF":        {"/key/swarm/psk/1.0.0/\r\n/base16/\r\n" + hex64 + "\r\n", ""},
		"31 bytes":        {"/key/swarm/psk/1.0.0/\n/base16/\n" + hex64[:62] + "\n", "62 characters, want 64 hex digits"},
		"33 bytes":        {"/key/swarm/psk/1.0.0/\n/base16/\n" + hex64 + "ab\n", "66 characters, want 64 hex digits"},
		"trailing text":   {"/key/swarm/psk/1.0.0/\n/base16/\n" + hex64 + " junk\n", "69 characters"},
		"a second line":   {"/key/swarm/psk/1.0.0/\n/base16/\n" + hex64 + "\n" + hex64 + "\n", "more than one line"},
		"not hex":         {"/key/swarm/psk/1.0.0/\n/base16/\n" + strings.Repeat("zz", 32) + "\n", "not hex"},
		"no header":       {hex64 + "\n", "not a libp2p PSK v1 key"},
		"another version": {"/key/swarm/psk/2.0.0/\n/base16/\n" + hex64 + "\n", "not a libp2p PSK v1 key"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadSwarmKey(path)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: err = %v, want one containing %q", name, err, c.want)
		}
	}
	sub := filepath.Join(dir, "keys")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSwarmKey(sub); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: err = %v", err)
	}
}

// TestLoadIdentityRefusesOpenModes: an identity other users can read is
// refused like a swarm key (whoever reads it can act as this peer).
func TestLoadIdentityRefusesOpenModes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.key")
	if _, err := WriteIdentity(path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIdentity(path); err != nil {
		t.Fatalf("mode 0600: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIdentity(path); err == nil || !strings.Contains(err.Error(), "act as this peer") {
		t.Errorf("mode 0644: err = %v", err)
	}
}
