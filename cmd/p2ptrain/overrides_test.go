package main

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
)

// resolveArgs parses join's flags from args and resolves the configuration
// as join does, without starting anything.
func resolveArgs(t *testing.T, args ...string) (config.Config, error) {
	t.Helper()
	fs := newFlagSet("join", io.Discard)
	pf := addPeerFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		t.Fatalf("flags %v: %v", args, err)
	}
	return pf.resolve()
}

// loopback are flags that make a peer valid on this machine whatever the
// defaults: a loopback listen address, no API, no mDNS.
var loopback = []string{"--listen", "/ip4/127.0.0.1/tcp/0", "--api", "", "--mdns=false"}

// TestOverridePrecedence: --set and the named flags win over P2PTRAIN_
// variables, which win over the file, which wins over the defaults; a
// named flag wins over --set for the same key.
func TestOverridePrecedence(t *testing.T) {
	file := writeFile(t, "c.toml", "[train]\nlr = 0.1\nmomentum = 0.5\nweight_decay = 0.01\n[allreduce]\ncodec = \"fp16\"\n")
	t.Setenv(envPrefix+"TRAIN_LR", "0.2")
	t.Setenv(envPrefix+"TRAIN_MOMENTUM", "0.6")
	t.Setenv(envPrefix+"ALLREDUCE_CODEC", "sint8")
	args := append(slices.Clone(loopback), "--config", file, "--set", "train.lr=0.3", "--set", "allreduce.codec=int8", "--codec", "onebit")
	cfg, err := resolveArgs(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key       string
		got, want any
	}{
		{"train.lr (--set over the environment and the file)", cfg.Train.LR, 0.3},
		{"train.momentum (the environment over the file)", cfg.Train.Momentum, 0.6},
		{"train.weight_decay (the file over the default)", cfg.Train.WeightDecay, 0.01},
		{"allreduce.codec (--codec over --set, the environment and the file)", cfg.Allreduce.Codec, "onebit"},
		{"train.batch_size (the default)", cfg.Train.BatchSize, config.DefaultConfig().Train.BatchSize},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.key, c.got, c.want)
		}
	}

	// The last --set of a key wins.
	if cfg, err := resolveArgs(t, append(slices.Clone(loopback), "--set", "train.lr=0.4", "--set", "train.lr=0.5")...); err != nil || cfg.Train.LR != 0.5 {
		t.Errorf("two --set train.lr: lr %v, %v; want 0.5", cfg.Train.LR, err)
	}
}

// TestOverrideValues: each value is parsed as its key's TOML type: lists
// comma-separated or as a TOML array, nested [train.gpt] keys, durations,
// booleans, unsigned integers and strings taken as they are.
func TestOverrideValues(t *testing.T) {
	t.Setenv(envPrefix+"TRAIN_GPT_D_MODEL", "64")
	t.Setenv(envPrefix+"GOSSIP_FAILURE_TIMEOUT", "2500ms")
	t.Setenv(envPrefix+"TRAIN_DATA_EXT", ".go, .txt")
	cfg, err := resolveArgs(t, append(slices.Clone(loopback),
		"--set", "train.hidden=256,128",
		"--set", "node.bootstrap=",
		"--set", "train.devices=[\"cpu:0\", \"cpu:1\"]",
		"--set", "train.gpt.layers=2",
		"--set", "train.gpt.heads=8",
		"--set", "gossip.heartbeat=250ms",
		"--set", "probe.enabled=false",
		"--set", "train.seed=1_000",
		"--set", `node.name=a "b" \c, d`,
		"--set", "node.listen=/ip4/127.0.0.1/tcp/0,/ip6/::1/tcp/0",
	)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key       string
		got, want any
	}{
		{"train.hidden", cfg.Train.Hidden, []int{256, 128}},
		{"node.bootstrap", cfg.Node.Bootstrap, []string{}},
		{"train.devices", cfg.Train.Devices, []string{"cpu:0", "cpu:1"}},
		{"train.data_ext", cfg.Train.DataExt, []string{".go", ".txt"}},
		{"train.gpt.layers", cfg.Train.GPT.Layers, 2},
		{"train.gpt.heads", cfg.Train.GPT.Heads, 8},
		{"train.gpt.d_model", cfg.Train.GPT.DModel, 64},
		{"gossip.heartbeat", cfg.Gossip.Heartbeat.D(), 250 * time.Millisecond},
		{"gossip.failure_timeout", cfg.Gossip.FailureTimeout.D(), 2500 * time.Millisecond},
		{"probe.enabled", cfg.Probe.Enabled, false},
		{"train.seed", cfg.Train.Seed, uint64(1000)},
		{"node.name", cfg.Node.Name, `a "b" \c, d`},
		{"node.listen (--listen wins)", cfg.Node.Listen, []string{"/ip4/127.0.0.1/tcp/0"}},
		{"train.gpt.context (untouched)", cfg.Train.GPT.Context, config.DefaultConfig().Train.GPT.Context},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.key, c.got, c.want)
		}
	}
}

// TestOverrideErrors: a value its key does not take is reported naming
// where it came from, the key and what the key takes.
func TestOverrideErrors(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"train.steps=abc", "--set train.steps=abc: train.steps takes an integer"},
		{"train.steps=ten", `train.steps takes an integer, not "ten"`}, // TOML's parser read a "t" as true's start
		{"train.steps=1.5", "train.steps takes an integer"},
		{"train.seed=-1", "train.seed takes a non-negative integer"},
		{"node.open=yes", "node.open takes true or false"},
		{"train.lr=fast", "train.lr takes a number"},
		{"gossip.heartbeat=soon", `gossip.heartbeat takes a duration: invalid duration "soon" (write it like "5s"`},
		{"train.hidden=1,x", "train.hidden takes a list (comma-separated, or a TOML array) of integers"},
		{"train.steps=1\ntrain.lr=5", "a value must be one line"},
		{"train.steps", "--set train.steps: want section.key=value"},
		{"train.gpt=2", `unknown key "train.gpt" (did you mean train.gpt.layers`},
		{"train.stepz=2", `unknown key "train.stepz" (did you mean train.steps?)`},
		{"train.pipeline_stages=fast", `train.pipeline_stages takes an integer or "auto"`},
	} {
		_, err := resolveArgs(t, append(slices.Clone(loopback), "--set", tc.set)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %q: error %v\nwant it to contain %q", tc.set, err, tc.want)
		}
	}
	// A bare number is nanoseconds, as in the file: Validate says so.
	_, err := resolveArgs(t, append(slices.Clone(loopback), "--set", "gossip.heartbeat=5")...)
	if err == nil || !strings.Contains(err.Error(), "gossip.heartbeat: 5ns is below 10ms: a bare number counts nanoseconds") {
		t.Errorf("--set gossip.heartbeat=5: %v", err)
	}
}

// TestValidationNamesTheSource: a value Validate refuses that came from an
// environment variable, --set or a flag says where it came from; one from
// the file says nothing more. Every flag's key is a configuration key.
func TestValidationNamesTheSource(t *testing.T) {
	t.Setenv(envPrefix+"GOSSIP_HEARTBEAT", "5")
	t.Setenv(envPrefix+"NODE_SWARM_KEY", filepath.Join(t.TempDir(), "missing.key")) // refused by the preflight checks
	file := writeFile(t, "c.toml", "[train]\nlr = -1.0\n")
	_, err := resolveArgs(t, append(slices.Clone(loopback), "--config", file, "--set", "train.momentum=7", "--min-peers", "-2")...)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"gossip.heartbeat: 5ns is below 10ms",
		"(set by environment variable P2PTRAIN_GOSSIP_HEARTBEAT)",
		"(set by environment variable P2PTRAIN_NODE_SWARM_KEY)",
		"(set by --set train.momentum=7)",
		"(set by --min-peers)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant it to contain %q", err, want)
		}
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if strings.HasPrefix(line, "train.lr:") && strings.Contains(line, "set by") {
			t.Errorf("the file's value is said to come from elsewhere: %s", line)
		}
	}
	if !strings.Contains(err.Error(), "train.lr:") {
		t.Errorf("the file's bad train.lr is not reported: %v", err)
	}
	keys := map[string]bool{}
	for _, k := range configKeys() {
		keys[k.name] = true
	}
	fs := newFlagSet("join", io.Discard)
	addPeerFlags(fs)
	for name, key := range flagKeys {
		if !keys[key] || fs.Lookup(name) == nil {
			t.Errorf("flagKeys: --%s sets %q, which is not a flag and a configuration key", name, key)
		}
	}
}

// TestOverrideStages: train.pipeline_stages takes "auto" and integers from
// --set and the environment, as from the file.
func TestOverrideStages(t *testing.T) {
	cfg, err := resolveArgs(t, append(slices.Clone(loopback), "--set", "train.model=gpt", "--set", "train.pipeline_stages=auto")...)
	if err != nil || !cfg.Train.PipelineStages.Auto() {
		t.Fatalf("--set train.pipeline_stages=auto: %v, %v", cfg.Train.PipelineStages, err)
	}
	t.Setenv(envPrefix+"TRAIN_PIPELINE_STAGES", "2")
	cfg, err = resolveArgs(t, append(slices.Clone(loopback), "--set", "train.model=gpt")...)
	if err != nil || cfg.Train.PipelineStages != 2 {
		t.Fatalf("%sTRAIN_PIPELINE_STAGES=2: %v, %v", envPrefix, cfg.Train.PipelineStages, err)
	}
}

// runJoin runs `p2ptrain join args` with a deadline, so that a peer this
// test expected to be refused cannot run on.
func runJoin(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code = run(ctx, append([]string{"join"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestUnknownKeysReportedTogether: an unknown --set key, an unknown
// P2PTRAIN_ variable, an unknown key and a range error of the file, and a
// bad flag value are all in one message, exit 2; the project's other
// P2PTRAIN_ variables are ignored.
func TestUnknownKeysReportedTogether(t *testing.T) {
	file := writeFile(t, "c.toml", "[train]\nlr = -5\ncolour = 1\n")
	t.Setenv(envPrefix+"TRAIN_STEPZ", "10")
	t.Setenv(envPrefix+"SOCKET", "/tmp/x.sock") // not a key, and known
	t.Setenv(envPrefix+"TEST_LOG", "info")
	code, stdout, stderr := runJoin(t, append(slices.Clone(loopback), "--config", file, "--set", "allreduce.codex=sint8", "--set", "train.steps=x")...)
	wantUsageError(t, code, stderr, []string{
		`unknown key "train.colour" (line 3)`,
		"environment variable " + envPrefix + "TRAIN_STEPZ: no configuration key has this name (did you mean " + envPrefix + "TRAIN_STEPS?)",
		`--set allreduce.codex=sint8: unknown key "allreduce.codex" (did you mean allreduce.codec?)`,
		"--set train.steps=x: train.steps takes an integer",
		"train.lr: -5 must be in (0, 100)",
	})
	if n := strings.Count(stderr, "p2ptrain:"); n != 1 {
		t.Errorf("%d messages, want 1:\n%s", n, stderr)
	}
	for _, name := range []string{"SOCKET", "TEST_LOG"} {
		if strings.Contains(stderr, envPrefix+name) {
			t.Errorf("stderr names %s%s, which is not a config key but one the project uses:\n%s", envPrefix, name, stderr)
		}
	}
	if strings.Contains(stdout, "dial this peer at:") {
		t.Errorf("the peer announced itself:\n%s", stdout)
	}
}

// TestPreflightExit2: files and devices the configuration names that
// cannot be read or opened exit 2 before the peer starts, every one of
// them reported in one message.
func TestPreflightExit2(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.key")
	if err := os.WriteFile(garbage, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(cuda.EnvLibrary, filepath.Join(dir, "libcuda.so.1")) // no driver, whatever this machine has
	train := append(slices.Clone(loopback), "--steps", "10")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"missing dataset", append(slices.Clone(train), "--set", "train.data_dir="+filepath.Join(dir, "nowhere")),
			[]string{"train.data_dir: Fashion-MNIST not found: " + filepath.Join(dir, "nowhere") + ": stat "}},
		{"empty text corpus", append(slices.Clone(train), "--model", "gpt", "--set", "train.data="+t.TempDir()),
			[]string{"train.data: no text:", "holds no non-empty regular files with extensions .go"}},
		{"unreadable swarm key", append(slices.Clone(loopback), "--swarm-key", garbage),
			[]string{"node.swarm_key: swarm key " + garbage + " is not a libp2p PSK v1 key"}},
		{"missing swarm key", append(slices.Clone(loopback), "--swarm-key", filepath.Join(dir, "none.key")),
			[]string{"node.swarm_key: read swarm key:", "no such file"}},
		{"missing identity", append(slices.Clone(loopback), "--identity", filepath.Join(dir, "id.key")),
			[]string{"node.identity: read identity:", "no such file"}},
		{"unparsable identity", append(slices.Clone(loopback), "--identity", garbage),
			[]string{"node.identity: identity " + garbage + " is not a libp2p private key"}},
		{"cuda without a GPU", append(slices.Clone(train), "--set", "train.devices=cpu,cuda:0", "--set", "train.data_dir="+filepath.Join(dir, "nowhere")),
			[]string{`train.devices[1]: "cuda:0": no usable GPU: libcuda.so.1 not found`, "p2ptrain devices", "train.data_dir:"}},
		{"a device twice", append(slices.Clone(train), "--set", "train.devices=cpu,cpu:0", "--set", "train.data_dir="+filepath.Join(dir, "nowhere")),
			[]string{`train.devices[1]: "cpu:0": device cpu:0 listed twice`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runJoin(t, tc.args...)
			wantUsageError(t, code, stderr, tc.want)
			if strings.Contains(stdout, "dial this peer at:") {
				t.Errorf("the peer announced itself:\n%s", stdout)
			}
		})
	}
}

// TestPreflightSkipsWhatIsNotUsed: a peer that does not train (an observer)
// or trains through an external process needs neither a dataset nor the
// devices, so their absence is no error.
func TestPreflightSkipsWhatIsNotUsed(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(cuda.EnvLibrary, filepath.Join(dir, "libcuda.so.1"))
	missing := []string{"--set", "train.data_dir=" + filepath.Join(dir, "nowhere"), "--set", "train.devices=cuda"}
	for _, args := range [][]string{
		append(slices.Clone(loopback), missing...),
		append(append(slices.Clone(loopback), missing...), "--steps", "10", "--trainer", "external"),
	} {
		if _, err := resolveArgs(t, args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestConfigKeysAreTheFile's: the keys --set and P2PTRAIN_ variables take
// are exactly those of config.toml's sections (every leaf of the defaults
// written as TOML), each with its own variable, none of them one of the
// project's other variables.
func TestConfigKeysAreTheFiles(t *testing.T) {
	b, err := toml.Marshal(config.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := toml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var want []string
	var leaves func(prefix string, m map[string]any)
	leaves = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				leaves(prefix+k+".", sub)
				continue
			}
			want = append(want, prefix+k)
		}
	}
	leaves("", doc)
	slices.Sort(want)
	var got []string
	envs := map[string]string{}
	for _, k := range configKeys() {
		got = append(got, k.name)
		if other, dup := envs[k.env()]; dup {
			t.Errorf("%s and %s share the variable %s", other, k.name, k.env())
		}
		envs[k.env()] = k.name
		if slices.Contains(otherEnv, k.env()) {
			t.Errorf("%s's variable %s is in otherEnv, which overrides ignore", k.name, k.env())
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("config keys:\n%v\nconfig.toml's keys:\n%v", got, want)
	}
	if envs[envPrefix+"TRAIN_GPT_LAYERS"] != "train.gpt.layers" || envs[envPrefix+"ALLREDUCE_CODEC"] != "allreduce.codec" {
		t.Errorf("variables: %v", envs)
	}
}

// envName matches a P2PTRAIN_ variable's name.
var envName = regexp.MustCompile(`P2PTRAIN_[A-Z0-9_]*[A-Z0-9]`)

// TestOtherEnvComplete: every P2PTRAIN_ variable the repository's files
// mention is a config key's or in otherEnv (so overrides do not reject a
// variable the project itself uses), and docs/configuration.md lists every
// one of otherEnv. That document itself is not searched: its examples show
// a misspelt variable.
func TestOtherEnvComplete(t *testing.T) {
	keys := map[string]bool{}
	for _, k := range configKeys() {
		keys[k.env()] = true
	}
	found := map[string]string{}
	root := filepath.Join("..", "..")
	doc := filepath.Join(root, "docs", "configuration.md")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || !d.Type().IsRegular() || info.Size() > 4<<20 || p == doc {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil || bytes.IndexByte(b, 0) >= 0 { // unreadable or binary
			return err
		}
		for _, m := range envName.FindAll(b, -1) {
			found[string(m)] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(found)) {
		if !keys[name] && !slices.Contains(otherEnv, name) {
			t.Errorf("%s (in %s) is neither a config key's variable nor in otherEnv", name, found[name])
		}
	}
	listed, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range otherEnv {
		if !bytes.Contains(listed, []byte("`"+name+"`")) {
			t.Errorf("docs/configuration.md does not list %s", name)
		}
	}
}
