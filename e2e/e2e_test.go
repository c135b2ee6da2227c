// Package e2e runs the built p2ptrain binary as several processes on loopback.
// These are the slow multi-process suites; `go test -short` skips them.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "p2ptrain-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "p2ptrain")
	out, err := exec.Command("go", "build", "-o", binary, "github.com/p2ptrain/p2ptrain/cmd/p2ptrain").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build p2ptrain: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one running `p2ptrain join`.
type proc struct {
	cmd   *exec.Cmd
	addr  string // first dialable multiaddr
	api   string // HOST:PORT of the local API
	done  chan struct{}
	err   error
	stder *strings.Builder

	mu       sync.Mutex
	doneLine string // the final "done ..." line of a training run
}

func startPeer(t *testing.T, args ...string) *proc {
	t.Helper()
	return startPeerConfig(t, "", args...)
}

// startPeerConfig is startPeer with extra TOML appended to the peer's config file.
func startPeerConfig(t *testing.T, extra string, args ...string) *proc {
	t.Helper()
	base := []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "127.0.0.1:0", "--mdns=false", "--cluster", "e2e", "--log-format", "json"}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "p2ptrain.toml")
	if err := os.WriteFile(cfg, []byte("[gossip]\nheartbeat = \"250ms\"\nfailure_timeout = \"1500ms\"\n"+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, append(append(base, "--config", cfg), args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), stder: &strings.Builder{}}
	cmd.Stderr = p.stder
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan struct{})
	started := make(chan struct{})
	go func() {
		<-readDone // Wait closes stdout: read it to the end first
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("peer %s stderr, last 40 lines:\n%s", p.addr, lastLines(p.stder.String(), 40))
		}
	})
	// One reader owns stdout: it records the addresses, then the final line.
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			p.mu.Lock()
			if strings.HasPrefix(l, "/ip4/") && p.addr == "" {
				p.addr = l
			}
			if a, ok := strings.CutPrefix(l, "local API: http://"); ok {
				p.api = strings.TrimSuffix(a, "/status")
				close(started)
			}
			if strings.HasPrefix(l, "done ") {
				p.doneLine = l
			}
			p.mu.Unlock()
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case <-started:
	case <-p.done:
		t.Fatalf("peer exited before printing its addresses: %s", p.stder.String())
	case <-time.After(20 * time.Second):
		t.Fatal("peer did not print its addresses within 20s")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.addr == "" {
		t.Fatal("peer printed no dialable address")
	}
	return p
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

type status struct {
	PeerID  string `json:"peer_id"`
	Members []struct {
		PeerID   string `json:"peer_id"`
		State    string `json:"state"`
		Observer bool   `json:"observer"`
	} `json:"members"`
	Ring struct {
		Epoch uint64   `json:"epoch"`
		Order []string `json:"order"`
	} `json:"ring"`
}

func getStatus(api string) (status, error) {
	var st status
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// sameRing checks that every peer reports one identical ring of n members.
func sameRing(peers []*proc, n int) error {
	var first *status
	for _, p := range peers {
		st, err := getStatus(p.api)
		if err != nil {
			return err
		}
		if len(st.Ring.Order) != n {
			return fmt.Errorf("%s: ring epoch %d has %d members, want %d", p.api, st.Ring.Epoch, len(st.Ring.Order), n)
		}
		if first == nil {
			first = &st
		} else if first.Ring.Epoch != st.Ring.Epoch || !slices.Equal(first.Ring.Order, st.Ring.Order) {
			return fmt.Errorf("rings differ: epoch %d vs %d", first.Ring.Epoch, st.Ring.Epoch)
		}
	}
	return nil
}

func eventually(t *testing.T, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestProcessesAgreeOnRing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process suite: skipped with -short")
	}
	// The peers train (a tiny model, for longer than the test runs): a
	// peer that does not train is an observer and never joins a ring.
	const trains = "[train]\nsteps = 1000000\nhidden = [16]\nbatch_size = 8\ntrain_samples = 512\neval_samples = 64\neval_every = 0\n"
	first := startPeerConfig(t, trains, "--name", "p0")
	peers := []*proc{first}
	for i := 1; i < 4; i++ {
		peers = append(peers, startPeerConfig(t, trains, "--name", fmt.Sprintf("p%d", i), "--bootstrap", first.addr))
	}
	took := eventually(t, 10*time.Second, "4 processes show the same ring", func() error { return sameRing(peers, 4) })
	t.Logf("4 processes agreed on the ring %s after the last start", took)

	// A plain join (no steps) follows the cluster as an observer: it is a
	// member, but the ring stays the four that train.
	obs := startPeer(t, "--name", "observer", "--bootstrap", first.addr)
	eventually(t, 10*time.Second, "the observer is seen and kept out of the ring", func() error {
		st, err := getStatus(first.api)
		if err != nil {
			return err
		}
		for _, m := range st.Members {
			if m.Observer && m.State == "alive" {
				return sameRing(append(slices.Clone(peers), obs), 4)
			}
		}
		return fmt.Errorf("no alive observer among %d members", len(st.Members))
	})

	// kill -9 one: the other three agree on a 3-member epoch within failure timeout + 3 s.
	victim := peers[1]
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	peers = slices.Delete(peers, 1, 2)
	took = eventually(t, 1500*time.Millisecond+3*time.Second, "3 processes agree after kill -9", func() error { return sameRing(peers, 3) })
	t.Logf("after kill -9: 3 processes agreed %s after the kill (failure timeout 1.5s)", took)

	// SIGTERM leaves cleanly: exit code 143 (128 + SIGTERM, what shells
	// expect of an interrupted command) and the others re-form without
	// waiting for the timeout.
	leaver := peers[2]
	if err := leaver.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leaver.done:
		if code := leaver.cmd.ProcessState.ExitCode(); code != 143 {
			t.Fatalf("SIGTERM: exit code %d (%v), want 143", code, leaver.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("peer did not exit within 10s of SIGTERM")
	}
	peers = peers[:2]
	eventually(t, 5*time.Second, "2 processes agree after a clean leave", func() error {
		if err := sameRing(peers, 2); err != nil {
			return err
		}
		st, err := getStatus(peers[0].api)
		if err != nil {
			return err
		}
		for _, m := range st.Members {
			if m.State == "left" {
				return nil
			}
		}
		return fmt.Errorf("no member shown as left")
	})
}

// TestProcessesTrain runs two `p2ptrain join --steps` processes on a slice of
// Fashion-MNIST: both print a final "done" line with the same parameter hash
// and exit 0.
func TestProcessesTrain(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process suite: skipped with -short")
	}
	train := []string{"--steps", "30", "--min-peers", "2", "--codec", "sint8", "--model", "mlp"}
	cfgExtra := "[train]\nhidden = [64]\nbatch_size = 16\ntrain_samples = 4096\neval_samples = 500\n"
	first := startPeerConfig(t, cfgExtra, append([]string{"--name", "t0"}, train...)...)
	second := startPeerConfig(t, cfgExtra, append([]string{"--name", "t1", "--bootstrap", first.addr}, train...)...)
	var lines []string
	for _, p := range []*proc{first, second} {
		select {
		case <-p.done:
		case <-time.After(2 * time.Minute):
			t.Fatal("training did not finish within 2 minutes")
		}
		if p.err != nil {
			t.Fatalf("peer exited with %v", p.err)
		}
		p.mu.Lock()
		done := p.doneLine
		p.mu.Unlock()
		if !strings.HasPrefix(done, "done step=30 ") || !strings.Contains(done, "param_hash=") {
			t.Fatalf("final line %q", done)
		}
		lines = append(lines, done)
	}
	if lines[0] != lines[1] {
		t.Fatalf("peers disagree:\n%s\n%s", lines[0], lines[1])
	}
	t.Logf("both processes: %s", lines[0])
}
