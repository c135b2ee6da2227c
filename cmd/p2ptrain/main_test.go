package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/pelletier/go-toml/v2"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigAndFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // every fragment must appear in stderr
	}{
		{"unknown key", []string{"join", "--config", writeFile(t, "c.toml", "[node]\nlisten = [\"/ip4/127.0.0.1/tcp/0\"]\ncolour = \"red\"\n")},
			[]string{`unknown key "node.colour"`, "line 3"}},
		{"unknown key beside a bad value", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[train]\nlrr = 1\nlr = -5\n")},
			[]string{`unknown key "train.lrr" (line 2)`, "train.lr: -5 must be in (0, 100)"}},
		{"unknown section", []string{"join", "--config", writeFile(t, "c.toml", "[nodes]\nx = 1\n")},
			[]string{`unknown key "nodes"`}},
		{"bad duration", []string{"join", "--config", writeFile(t, "c.toml", "[gossip]\nheartbeat = \"soon\"\n")},
			[]string{"gossip.heartbeat", `invalid duration "soon"`}},
		{"negative timeout", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[gossip]\nfailure_timeout = \"-5s\"\n")},
			[]string{"gossip.failure_timeout: -5s is outside 20ms..10m0s"}},
		{"bare number as a duration", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[gossip]\nheartbeat = 5\n")},
			[]string{"gossip.heartbeat: 5ns is below 10ms: a bare number counts nanoseconds"}},
		{"every problem at once", []string{"join", "--listen", "nonsense", "--bootstrap", "/ip4/10.0.0.1/tcp/4001", "--api", "7420",
			"--config", writeFile(t, "c.toml", "[gossip]\nfailure_timeout = \"0s\"\n[log]\nlevel = \"loud\"\n")},
			[]string{"node.listen[0]: invalid multiaddr \"nonsense\"", "node.bootstrap[0]", "/p2p/<peer-id>", "node.api", "gossip.failure_timeout", "log.level"}},
		{"link codecs of another class", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[allreduce]\nlink_codecs = \"topk\"\n")},
			[]string{"allreduce.link_codecs", "per-link codecs need a linear or quantized codec"}},
		{"link codecs for a codec without them", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[allreduce]\ncodec = \"sint8\"\nlink_codecs = \"fp16\"\n")},
			[]string{"allreduce.link_codecs", `"fp16" needs a linear or quantized allreduce.codec`}},
		{"empty link codecs", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[allreduce]\nlink_codecs = \"\"\n")},
			[]string{"allreduce.link_codecs: empty"}},
		{"negative low-rank warm-up", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[train]\nlowrank_warmup_steps = -1\n")},
			[]string{"train.lowrank_warmup_steps"}},
		{"dropout out of range", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[train]\ndropout = 1.0\n")},
			[]string{"train.dropout: 1 must be in [0, 1)"}},
		{"unknown robust aggregation", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[allreduce]\nrobust = \"median\"\nrobust_iters = 0\n")},
			[]string{`allreduce.robust: "median" is not one of off, centered_clip`}},
		{"robust aggregation of a low-rank codec", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[allreduce]\nrobust = \"centered_clip\"\ncodec = \"powersgd:rank=2\"\nrobust_tau = -1\nschedule = \"ring\"\n")},
			[]string{"allreduce.robust: needs each member's contribution", "allreduce.robust_tau: -1 must be a positive number", `allreduce.schedule: "ring" cannot carry allreduce.robust`}},
		{"exclusion back-off as a bare number", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[gossip]\nexclude_for = 30\n[train]\nexclude_after = 0\nready_timeout = \"10m\"\n")},
			[]string{"gossip.exclude_for: 30ns is below 1s", "train.exclude_after: 0 must be at least 1"}},
		{"API on a public address", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "0.0.0.0:7420"},
			[]string{"node.api", "not a loopback address", "--api-public"}},
		{"bad bootstrap multiaddr", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", "/ip4/1.2.3/tcp/1"},
			[]string{"node.bootstrap[0]: invalid multiaddr"}},
		{"no key on a public address", []string{"join", "--listen", "/ip4/0.0.0.0/tcp/0"},
			[]string{"without a swarm key", "p2ptrain keygen --swarm-key"}},
		{"missing config file", []string{"join", "--config", "/nonexistent/p2ptrain.toml"}, []string{"no such file"}},
		{"missing text corpus", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[train]\nmodel = \"gpt\"\ndata = \"/nonexistent/corpus\"\n")},
			[]string{"train.data", "/nonexistent/corpus"}},
		{"empty text corpus", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "", "--mdns=false", "--steps", "10",
			"--config", writeFile(t, "c.toml", "[train]\nmodel = \"gpt\"\ndata = \""+t.TempDir()+"\"\n")},
			[]string{"train.data", "no text", ".go"}},
		{"gpt shape", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--config", writeFile(t, "c.toml", "[train.gpt]\nd_model = 100\nheads = 3\nvocab = 300\n")},
			[]string{"train.gpt.d_model: 100 is not a multiple of train.gpt.heads (3)", "train.gpt.vocab: 300 must be in [2, 256]"}},
		{"sync_every not dividing the steps", []string{"join", "--listen", "/ip4/127.0.0.1/tcp/0", "--steps", "10", "--config", writeFile(t, "c.toml", "[train]\nsync_every = 3\nouter_momentum = 1\n")},
			[]string{"train.sync_every: 3 must divide train.steps (10)", "train.outer_momentum: 1 must be in [0, 1)"}},
		{"unknown flag", []string{"join", "--colour"}, []string{"flag provided but not defined: -colour"}},
		{"stray argument", []string{"join", "extra"}, []string{`unexpected argument "extra"`}},
		{"unknown command", []string{"frobnicate"}, []string{`unknown command "frobnicate"`}},
		{"keygen without target", []string{"keygen"}, []string{"exactly one of --swarm-key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tt.args...)
			wantUsageError(t, code, stderr, tt.want)
		})
	}
}

// wantUsageError checks that a command exited 2 with every fragment of
// want in its stderr, and no stack trace.
func wantUsageError(t *testing.T, code int, stderr string, want []string) {
	t.Helper()
	if code != 2 {
		t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
		t.Errorf("stderr has a stack trace:\n%s", stderr)
	}
}

// TestHelpGoesToStdout: every command's help, asked for with -h, --help or
// `help CMD`, is printed on stdout with exit 0 and nothing on stderr.
func TestHelpGoesToStdout(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"join", "--help"}, "-steps"},
		{[]string{"help", "join"}, "-steps"},
		{[]string{"keygen", "-h"}, "-swarm-key"},
		{[]string{"help", "status"}, "-api"},
		{[]string{"help", "bench", "allreduce"}, "-codec"},
		{[]string{"help", "bench"}, "bench codecs"},
		{[]string{"help"}, "p2ptrain join"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != 0 || !strings.Contains(stdout, tc.want) || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q…, stderr %q; want 0, a usage naming %s, nothing", tc.args, code, first(stdout, 80), stderr, tc.want)
		}
	}
}

func first(s string, n int) string { return s[:min(n, len(s))] }

// TestFlagErrorPrintedOnce: a bad flag is reported once, naming the flag,
// with a one-line hint and no usage dump.
func TestFlagErrorPrintedOnce(t *testing.T) {
	code, stdout, stderr := runCLI(t, "join", "--colour")
	if code != 2 || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want 2 and nothing", code, stdout)
	}
	if n := strings.Count(stderr, "flag provided but not defined: -colour"); n != 1 {
		t.Errorf("the error appears %d times in stderr:\n%s", n, stderr)
	}
	if strings.Contains(stderr, "Usage of") || strings.Count(stderr, "\n") > 2 || !strings.Contains(stderr, "p2ptrain help join") {
		t.Errorf("stderr should be the error and a one-line hint:\n%s", stderr)
	}
}

// TestInterruptedRunExitCode: a command that a signal stopped and that
// otherwise succeeded exits 128 + the signal; a failure keeps its code.
func TestInterruptedRunExitCode(t *testing.T) {
	for _, tc := range []struct {
		code int
		sig  syscall.Signal
		want int
	}{{0, syscall.SIGINT, 130}, {0, syscall.SIGTERM, 143}, {1, syscall.SIGTERM, 1}, {2, syscall.SIGINT, 2}, {0, 0, 0}} {
		if got := exitCode(tc.code, tc.sig); got != tc.want {
			t.Errorf("exitCode(%d, %v) = %d, want %d", tc.code, tc.sig, got, tc.want)
		}
	}
}

func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	code, out, stderr := runCLI(t, "keygen", "--identity", filepath.Join(dir, "id.key"))
	if code != 0 || !strings.HasPrefix(out, "12D3KooW") {
		t.Fatalf("identity: code %d out %q err %q", code, out, stderr)
	}
	code, _, stderr = runCLI(t, "keygen", "--swarm-key", filepath.Join(dir, "swarm.key"))
	if code != 0 {
		t.Fatalf("swarm key: code %d err %q", code, stderr)
	}
	for _, f := range []string{"id.key", "swarm.key"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "swarm.key"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 || lines[0] != "/key/swarm/psk/1.0.0/" || lines[1] != "/base16/" || len(lines[2]) != 64 {
		t.Fatalf("swarm key is not PSK v1:\n%s", b)
	}
	// Never overwrite a key.
	if code, _, stderr := runCLI(t, "keygen", "--swarm-key", filepath.Join(dir, "swarm.key")); code == 0 || !strings.Contains(stderr, "already exists") {
		t.Fatalf("overwrote a key: code %d, %s", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "p2ptrain ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

func TestStatusWithoutPeer(t *testing.T) {
	code, _, stderr := runCLI(t, "status", "--api", "127.0.0.1:1")
	if code != 1 || !strings.Contains(stderr, "no p2ptrain peer answering at 127.0.0.1:1") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
}

// TestStatusReadsTheAPIAddress: the URL a peer prints is taken as its
// HOST:PORT; anything that is not HOST:PORT is a usage error naming it.
func TestStatusReadsTheAPIAddress(t *testing.T) {
	code, _, stderr := runCLI(t, "status", "--api", "http://127.0.0.1:1/")
	if code != 1 || !strings.Contains(stderr, "no p2ptrain peer answering at 127.0.0.1:1 ") {
		t.Fatalf("a URL: code %d stderr %q", code, stderr)
	}
	for _, bad := range []string{"", "garbage", "127.0.0.1", ":7420", "127.0.0.1:99999", "127.0.0.1:http"} {
		code, _, stderr := runCLI(t, "status", "--api", bad)
		if code != 2 || !strings.Contains(stderr, "--api: ") || !strings.Contains(stderr, strconv.Quote(bad)) {
			t.Errorf("--api %q: code %d stderr %q", bad, code, stderr)
		}
	}
}

// TestJoinOnAPortInUseSaysWhich: a listen port another process holds
// fails naming node.listen and the fix, without libp2p's stack traces.
func TestJoinOnAPortInUseSaysWhich(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	code, _, stderr := runCLI(t, "join", "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port), "--api", "", "--mdns=false")
	if code != 1 || !strings.Contains(stderr, "node.listen") || !strings.Contains(stderr, "another process holds the port") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
	if strings.Contains(stderr, "runtime.main") || strings.Contains(stderr, ".go:") {
		t.Fatalf("a stack trace in %q", stderr)
	}
}

// TestConfigFileWithAByteOrderMark: a UTF-8 BOM (some editors write one)
// is not taken for the start of a key.
func TestConfigFileWithAByteOrderMark(t *testing.T) {
	cfg, err := loadConfig(writeFile(t, "bom.toml", "\uFEFF[train]\nsteps = 5\n"))
	if err != nil || cfg.Train.Steps != 5 {
		t.Fatalf("steps %d, %v", cfg.Train.Steps, err)
	}
}

// TestShippedConfigIsDefaults checks that config.toml at the repository root
// parses and documents exactly the built-in defaults.
func TestShippedConfigIsDefaults(t *testing.T) {
	cfg, err := loadConfig("../../config.toml")
	if err != nil {
		t.Fatalf("config.toml: %v", err)
	}
	def := config.DefaultConfig()
	if !reflect.DeepEqual(cfg, def) {
		t.Fatalf("config.toml differs from the defaults:\nfile:     %+v\ndefaults: %+v", cfg, def)
	}
	// Every key of the configuration is written out in config.toml.
	want, err := toml.Marshal(def)
	if err != nil {
		t.Fatal(err)
	}
	var wantKeys, gotKeys map[string]any
	if err := toml.Unmarshal(want, &wantKeys); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("../../config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := toml.Unmarshal(data, &gotKeys); err != nil {
		t.Fatal(err)
	}
	for section, keys := range wantKeys {
		got, _ := gotKeys[section].(map[string]any)
		for key := range keys.(map[string]any) {
			if _, ok := got[key]; !ok {
				t.Errorf("config.toml does not document %s.%s", section, key)
			}
		}
	}
}

// TestStatusPrintsWhyItWaits: `p2ptrain status` shows why the coordinator
// holds back an epoch (or this peer refuses its coordinator's) and why the
// trainer waits, as /status gives them.
func TestStatusPrintsWhyItWaits(t *testing.T) {
	var out strings.Builder
	st := node.Status{PeerID: "12D3KooWAbc", Name: "a", Codec: "none", TrainerWaiting: "for peers: ring epoch 5 has 1 of the 2 members train.min_peers asks for"}
	st.Ring.Waiting = "refusing epoch 7 of coordinator b: no quorum"
	printStatus(&out, st)
	for _, want := range []string{"waiting: refusing epoch 7 of coordinator b: no quorum", "trainer  waiting for peers: ring epoch 5 has 1 of the 2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status printed\n%s\nwithout %q", out.String(), want)
		}
	}
}
