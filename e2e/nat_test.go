package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNATTraversal runs bench/nat.sh: peers behind two NAT routers (network
// namespaces with iptables MASQUERADE) and a public bootstrap peer with a
// relay train together. Behind NATs that keep a connection's port the two
// peers meet through the relay and hole-punch a direct connection; behind
// NATs with random ports they stay relayed. Both runs must end with
// identical parameter hashes on every peer. It needs root (namespaces,
// iptables) and is skipped otherwise.
func TestNATTraversal(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process suite: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: bench/nat.sh builds network namespaces and NAT routers with iptables")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join("..", "bench", "nat.sh"), "--binary", binary)
	out, err := cmd.CombinedOutput()
	text := string(out)
	if line, ok := findLine(text, "nat: SKIP: "); ok {
		t.Skip(line)
	}
	if err != nil {
		t.Fatalf("bench/nat.sh: %v\n%s", err, text)
	}
	for _, want := range []string{"nat case a (eim NAT", "nat case b (random NAT"} {
		line, ok := findLine(text, want)
		if !ok || !strings.HasSuffix(line, "hashes equal") {
			t.Fatalf("bench/nat.sh printed no line %q ending in \"hashes equal\":\n%s", want, text)
		}
		t.Log(line)
	}
}

// findLine returns the first line of text that starts with prefix.
func findLine(text, prefix string) (string, bool) {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}
