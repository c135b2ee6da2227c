package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/compress"
)

func TestParseQuantity(t *testing.T) {
	tests := []struct {
		in    string
		bytes bool
		want  int
		err   string // fragment of the error, "" for none
	}{
		{"4096", false, 4096, ""},
		{"4Mi", false, 4 << 20, ""},
		{"4M", false, 4 << 20, ""},
		{"16k", false, 16 << 10, ""},
		{"64MiB", true, 64 << 20, ""},
		{"4MiB", true, 4 << 20, ""},
		{"1GiB", true, 1 << 30, ""},
		{"1.5KiB", true, 1536, ""},
		{"4MB", true, 4_000_000, ""},
		{"100B", true, 100, ""},
		{" 8 MiB ", true, 8 << 20, ""},
		{"4MiB", false, 0, `unknown unit "MiB"`},
		{"4XB", true, 0, `unknown unit "XB"`},
		{"", true, 0, "invalid size"},
		{"MiB", true, 0, "invalid size"},
		{"-4", false, 0, "invalid count"},
		{"0.3", false, 0, "not a whole number"},
		{"1.2.3", true, 0, "invalid size"},
		{"9999GiB", true, 0, "too large"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q/bytes=%v", tt.in, tt.bytes), func(t *testing.T) {
			got, err := parseQuantity(tt.in, tt.bytes)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %d, %v; want an error with %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %d, %v; want %d", got, err, tt.want)
			}
			// Defaults print the way they are read back.
			if back, err := parseQuantity(formatQuantity(got, tt.bytes), tt.bytes); err != nil || back != got {
				t.Fatalf("formatQuantity(%d) = %q reads back as %d, %v", got, formatQuantity(got, tt.bytes), back, err)
			}
		})
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want float64 // bytes/s; -1: an error
	}{
		{"1gbit", 125e6},
		{"100mbit", 12.5e6},
		{"100Mbit/s", 12.5e6},
		{"2.5gbit", 312.5e6},
		{"800kbit", 100e3},
		{"unlimited", 0},
		{"0", 0},
		{"5mbps", -1}, // tc's mbps is megabytes: refused as ambiguous
		{"fast", -1},
		{"100", -1},
	}
	for _, tt := range tests {
		got, err := parseRate(tt.in)
		switch {
		case tt.want < 0 && err == nil:
			t.Errorf("parseRate(%q) = %v, want an error", tt.in, got)
		case tt.want >= 0 && (err != nil || got != tt.want):
			t.Errorf("parseRate(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	var f rateFlag
	if err := f.Set("100mbit,1gbit,1gbit"); err != nil || len(f.rates) != 3 || f.String() != "100mbit,1gbit,1gbit" {
		t.Fatalf("rate list: %v %v %q", f.rates, err, f.String())
	}
}

func TestSplitSpecs(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  bool
	}{
		{"", nil, false},
		{"int8", []string{"int8"}, false},
		{"none,fp16", []string{"none", "fp16"}, false},
		{"qsgd:bits=4,block=512,int8,topk:ratio=0.01,dgc=true", []string{"qsgd:bits=4,block=512", "int8", "topk:ratio=0.01,dgc=true"}, false},
		{"int8,,fp16", nil, true},
		{"bogus", nil, true},
	}
	for _, tt := range tests {
		got, err := splitSpecs(tt.in)
		if (err != nil) != tt.err || !slices.Equal(got, tt.want) {
			t.Errorf("splitSpecs(%q) = %q, %v; want %q (error %v)", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// TestBenchCodecsJSON checks that `bench codecs --json` lists every codec
// with exactly the documented fields.
func TestBenchCodecsJSON(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "codecs", "--json", "--size", "4096", "--repeats", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("output is not a JSON list: %v\n%s", err, out)
	}
	var got []string
	fields := []string{"codec", "decode_gbps", "encode_gbps", "ratio", "rel_error"}
	for _, r := range rows {
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, fields) {
			t.Errorf("object has fields %v, want exactly %v", keys, fields)
		}
		got = append(got, r["codec"].(string))
	}
	if want := compress.Specs(); !slices.Equal(got, want) {
		t.Fatalf("codecs %v, want every codec %v", got, want)
	}
	// The table form, and a --codecs subset.
	code, out, stderr = runCLI(t, "bench", "codecs", "--size", "1Ki", "--codecs", "qsgd:bits=4,block=512,int8", "--repeats", "1")
	if code != 0 || !strings.Contains(out, "qsgd:bits=4,block=512") || !strings.Contains(out, "int8:block=2048") ||
		strings.Contains(out, "onebit") {
		t.Fatalf("table: exit %d\n%s%s", code, out, stderr)
	}
}

// checkAllreduceJSON parses one `bench allreduce --json` object and checks
// its fields and the bandwidth conventions.
func checkAllreduceJSON(t *testing.T, line string, peers, size int) map[string]any {
	t.Helper()
	var r map[string]any
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, line)
	}
	keys := make([]string, 0, len(r))
	for k := range r {
		// A cluster member's own median (checked by the cluster test) and the
		// machine's CPU (counted in 10 ms ticks: absent when a short run took
		// none).
		if k != "own_median_s" && k != "machine_cpu_s_per_gb" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	want := []string{"algbw_gbps", "busbw_gbps", "codec", "cpu_s_per_gb", "median_s", "peers", "schedule", "size_bytes", "wire_bytes_per_peer"}
	if _, ok := r["ideal_s"]; ok { // with the link rates known
		want = []string{"algbw_gbps", "busbw_gbps", "codec", "cpu_s_per_gb", "efficiency", "ideal_s", "median_s", "peers", "schedule", "size_bytes", "wire_bytes_per_peer"}
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("fields %v, want exactly %v", keys, want)
	}
	if w := r["wire_bytes_per_peer"].(float64); !(w > 0) {
		t.Fatalf("wire_bytes_per_peer %v", w)
	}
	// Moving and summing the bytes costs CPU: some, and (on any machine
	// these tests run on) far less than 1000 s per GB.
	if c := r["cpu_s_per_gb"].(float64); !(c > 0 && c < 1000) {
		t.Fatalf("cpu_s_per_gb %v", c)
	}
	if ideal, ok := r["ideal_s"].(float64); ok {
		if eff := r["efficiency"].(float64); math.Abs(eff-ideal/r["median_s"].(float64)) > 1e-9*eff {
			t.Errorf("efficiency %v is not ideal_s/median_s", eff)
		}
	}
	if r["peers"].(float64) != float64(peers) || r["size_bytes"].(float64) != float64(size) {
		t.Fatalf("peers %v size %v, want %d and %d", r["peers"], r["size_bytes"], peers, size)
	}
	med, alg, bus := r["median_s"].(float64), r["algbw_gbps"].(float64), r["busbw_gbps"].(float64)
	if !(med > 0) {
		t.Fatalf("median_s %v", med)
	}
	// Gbit/s: size·8 / median / 1e9; busbw = algbw·2(W−1)/W.
	if d := alg - float64(size)*8/med/1e9; math.Abs(d) > 1e-9*alg {
		t.Errorf("algbw %v is not size·8/median/1e9", alg)
	}
	if d := bus - alg*2*float64(peers-1)/float64(peers); math.Abs(d) > 1e-9*alg {
		t.Errorf("busbw %v is not algbw·2(W−1)/W", bus)
	}
	return r
}

// shared returns a `bench allreduce --json` line without the figures of the
// peer that printed it (the bytes it sent, its link's ideal and efficiency).
func shared(t *testing.T, line string) string {
	t.Helper()
	var r map[string]any
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, line)
	}
	for _, k := range []string{"wire_bytes_per_peer", "ideal_s", "efficiency", "cpu_s_per_gb", "machine_cpu_s_per_gb", "own_median_s"} {
		delete(r, k)
	}
	b, _ := json.Marshal(r)
	return string(b)
}

func TestBenchAllreduceInproc(t *testing.T) {
	code, out, stderr := runCLI(t, "bench", "allreduce", "--inproc", "--peers", "3", "--size", "1MiB", "--rounds", "2", "--bandwidth", "1gbit", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if strings.Count(out, "\n") != 1 {
		t.Fatalf("want one line, got:\n%s", out)
	}
	r := checkAllreduceJSON(t, out, 3, 1<<20)
	if r["codec"] != "none" || r["schedule"] != "ring" {
		t.Fatalf("codec %v schedule %v", r["codec"], r["schedule"])
	}
	prof := filepath.Join(t.TempDir(), "cpu.pprof")
	code, _, stderr = runCLI(t, "bench", "allreduce", "--inproc", "--peers", "2", "--size", "64KiB", "--rounds", "1", "--cpuprofile", prof)
	if st, err := os.Stat(prof); code != 0 || err != nil || st.Size() == 0 {
		t.Fatalf("--cpuprofile: exit %d, %v\n%s", code, err, stderr)
	}
	code, out, stderr = runCLI(t, "bench", "allreduce", "--inproc", "--peers", "2", "--size", "64KiB", "--rounds", "1",
		"--codec", "int8", "--bandwidth", "1gbit,10gbit", "--latency", "100us")
	if code != 0 || !strings.HasPrefix(out, "size 64KiB  codec int8:block=2048  schedule direct  peers 2") {
		t.Fatalf("line form: exit %d\n%s%s", code, out, stderr)
	}
	// Schedule auto with per-link codecs picks what a training cluster
	// picks: fp16 on the slow peer's ring links rather than shares.
	for links, want := range map[string]string{"off": "auto:proportional", "auto": "auto:ring+links"} {
		code, out, stderr = runCLI(t, "bench", "allreduce", "--inproc", "--peers", "4", "--size", "256KiB", "--rounds", "1",
			"--schedule", "auto", "--bandwidth", "100mbit,1gbit,1gbit,1gbit", "--link-codecs", links, "--json")
		if r := checkAllreduceJSON(t, out, 4, 256<<10); code != 0 || r["schedule"] != want {
			t.Errorf("--link-codecs %s: exit %d, schedule %v, want %s\n%s", links, code, r["schedule"], want, stderr)
		}
	}
}

func TestBenchFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // fragment of stderr; it names the flag
	}{
		{"no benchmark", []string{"bench"}, "codecs or allreduce"},
		{"unknown benchmark", []string{"bench", "disks"}, `unknown benchmark "disks"`},
		{"codecs size unit", []string{"bench", "codecs", "--size", "4MiB"}, "flag -size"},
		{"codecs zero size", []string{"bench", "codecs", "--size", "0"}, "--size must be positive"},
		{"codecs unknown codec", []string{"bench", "codecs", "--codecs", "int8,zip"}, `--codecs: compress: unknown codec "zip"`},
		{"codecs repeats", []string{"bench", "codecs", "--repeats", "0"}, "--repeats"},
		{"allreduce size", []string{"bench", "allreduce", "--inproc", "--size", "lots"}, "flag -size"},
		{"allreduce odd size", []string{"bench", "allreduce", "--inproc", "--size", "6"}, "--size must be a positive multiple of 4"},
		{"allreduce codec", []string{"bench", "allreduce", "--inproc", "--codec", "qsgd:bits=3"}, "--codec"},
		{"allreduce schedule", []string{"bench", "allreduce", "--inproc", "--schedule", "star"}, `--schedule: allreduce: invalid configuration: schedule "star"`},
		{"allreduce rounds", []string{"bench", "allreduce", "--inproc", "--rounds", "-1"}, "--rounds"},
		{"allreduce cpuprofile", []string{"bench", "allreduce", "--inproc", "--cpuprofile", "/nonexistent/dir/cpu.pprof"}, "--cpuprofile: open /nonexistent/dir/cpu.pprof"},
		{"allreduce chunk", []string{"bench", "allreduce", "--inproc", "--chunk-bytes", "0"}, "--chunk-bytes must be a positive multiple of 4"},
		{"allreduce buckets", []string{"bench", "allreduce", "--inproc", "--buckets", "0"}, "--buckets"},
		{"allreduce bandwidth unit", []string{"bench", "allreduce", "--inproc", "--bandwidth", "10mbps"}, "flag -bandwidth"},
		{"allreduce bandwidth count", []string{"bench", "allreduce", "--inproc", "--peers", "3", "--bandwidth", "1gbit,1gbit"}, "--bandwidth has 2 rates for 3 peers"},
		{"allreduce peers", []string{"bench", "allreduce", "--inproc", "--peers", "0"}, "--peers"},
		{"allreduce latency", []string{"bench", "allreduce", "--inproc", "--latency", "-1ms"}, "--latency"},
		{"allreduce link codecs", []string{"bench", "allreduce", "--inproc", "--link-codecs", "onebit"}, "--link-codecs: want off, auto or a linear or quantized codec spec"},
		{"cluster link codecs", []string{"bench", "allreduce", "--expect", "3", "--link-codecs", "topk"}, "--link-codecs: want off, auto or a linear or quantized codec spec"},
		{"cluster link codecs for sint8", []string{"bench", "allreduce", "--expect", "3", "--codec", "sint8", "--link-codecs", "auto", "--listen", "/ip4/127.0.0.1/tcp/0"},
			"--link-codecs auto: allreduce: invalid configuration: codec sint8:block=2048 is shared-scale"},
		{"inproc with expect", []string{"bench", "allreduce", "--inproc", "--expect", "3"}, "--expect is for a cluster member"},
		{"inproc with listen", []string{"bench", "allreduce", "--inproc", "--listen", "/ip4/127.0.0.1/tcp/0"}, "--listen starts a real peer"},
		{"peers without inproc", []string{"bench", "allreduce", "--expect", "3", "--peers", "3"}, "--peers needs --inproc"},
		{"no expect", []string{"bench", "allreduce"}, "--expect N"},
		{"cluster timeout", []string{"bench", "allreduce", "--expect", "2", "--timeout", "0s"}, "--timeout"},
		{"cluster steps", []string{"bench", "allreduce", "--expect", "2", "--steps", "5"}, "--steps"},
		{"cluster config", []string{"bench", "allreduce", "--expect", "2", "--listen", "nonsense"}, `node.listen[0]: invalid multiaddr "nonsense"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tt.args...)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Fatalf("stderr lacks %q:\n%s", tt.want, stderr)
			}
		})
	}
}

// lockedBuffer is an io.Writer safe for the concurrent writers of a peer
// (its loggers and libp2p's) and for reading while they write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var loopbackAddr = regexp.MustCompile(`(?m)^\s+(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\S+)$`)

// TestBenchAllreduceCluster runs three cluster members in this process on
// loopback: the first one's stdout gives the bootstrap address, all three
// must exit 0 and print the same figures.
func TestBenchAllreduceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three libp2p peers")
	}
	conf := writeFile(t, "gossip.toml", "[gossip]\nheartbeat = \"250ms\"\nfailure_timeout = \"1500ms\"\n")
	tests := []struct {
		name     string
		extra    []string
		codec    string
		schedule string // prefix: auto picks from the links measured so far
	}{
		{"fp32 ring", []string{"--link-rate", "1gbit"}, "none", "ring"},
		{"sint8 auto", []string{"--codec", "sint8", "--schedule", "auto"}, "sint8:block=2048", "auto:"},
		// onebit cannot be summed inside a ring: the direct schedule runs, and
		// the result says so (it once reported the schedule asked for).
		{"onebit asked to ring", []string{"--codec", "onebit", "--schedule", "ring"}, "onebit:block=2048", "direct"},
		// fp16 on the edges the probes found slow, if any ("ring+links").
		{"fp32 ring with per-link codecs", []string{"--schedule", "ring", "--link-codecs", "fp16"}, "none", "ring"},
		// Groups of about √W consecutive peers: 2 and 1 here.
		{"fp32 hierarchical", []string{"--schedule", "hier"}, "none", "hier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const size = 256 << 10
			args := append([]string{"bench", "allreduce", "--expect", "3", "--size", "256KiB", "--rounds", "2", "--json",
				"--listen", "/ip4/127.0.0.1/tcp/0", "--api", "", "--mdns=false", "--cluster", "benchtest",
				"--config", conf, "--timeout", "45s", "--log-level", "info"}, tt.extra...)
			var outs, errs [3]lockedBuffer
			var codes [3]int
			var wg sync.WaitGroup
			wg.Go(func() { codes[0] = run(ctx, args, &outs[0], &errs[0]) })
			var boot string
			for boot == "" {
				if m := loopbackAddr.FindStringSubmatch(outs[0].String()); m != nil {
					boot = m[1]
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("the first peer printed no address:\n%s\n%s", outs[0].String(), errs[0].String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			for i := 1; i < 3; i++ {
				wg.Go(func() { codes[i] = run(ctx, append(slices.Clone(args), "--bootstrap", boot), &outs[i], &errs[i]) })
			}
			wg.Wait()
			for i := range codes {
				if codes[i] != 0 {
					t.Errorf("peer %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, codes[i], outs[i].String(), errs[i].String())
				}
			}
			if t.Failed() {
				t.FailNow()
			}
			var lines [3]string
			for i := range codes {
				out := strings.TrimSpace(outs[i].String())
				if !strings.Contains(out, "dial this peer at:") {
					t.Errorf("peer %d did not print its addresses like join:\n%s", i, out)
				}
				lines[i] = out[strings.LastIndexByte(out, '\n')+1:]
				r := checkAllreduceJSON(t, lines[i], 3, size)
				if _, ok := r["ideal_s"]; ok != slices.Contains(tt.extra, "--link-rate") {
					t.Errorf("peer %d: ideal_s present %v with flags %v: want it exactly with --link-rate", i, ok, tt.extra)
				}
				// An fp32 ring peer sends 2(W−1)/W of the buffer, plus frame headers.
				if want := 2.0 * 2 / 3 * size; tt.codec == "none" && tt.schedule == "ring" && len(tt.extra) == 2 {
					if w := r["wire_bytes_per_peer"].(float64); w < want || w > 1.05*want {
						t.Errorf("peer %d: %.0f bytes on the wire per round, want %.0f plus headers", i, w, want)
					}
				}
				// A round lasts as long as its slowest peer took: no peer's own
				// median exceeds the round's.
				own, ok := r["own_median_s"].(float64)
				if med := r["median_s"].(float64); !ok || !(own > 0) || own > med*(1+1e-5) {
					t.Errorf("peer %d: own_median_s %v, median_s %v: want 0 < own ≤ median", i, r["own_median_s"], med)
				}
				if r["codec"] != tt.codec || !strings.HasPrefix(r["schedule"].(string), tt.schedule) {
					t.Errorf("peer %d: codec %v schedule %v, want %s %s", i, r["codec"], r["schedule"], tt.codec, tt.schedule)
				}
			}
			// A round's time is its slowest peer's: every peer prints the same
			// figures, except its own median and what it sent itself (and so
			// its link's ideal).
			if shared(t, lines[1]) != shared(t, lines[0]) || shared(t, lines[2]) != shared(t, lines[0]) {
				t.Errorf("peers disagree:\n%s\n%s\n%s", lines[0], lines[1], lines[2])
			}
			t.Log(lines[0])
		})
	}
}
