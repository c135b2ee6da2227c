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
