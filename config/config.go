// Package config is config.toml: every section's keys with their defaults,
// and Validate, which reports every invalid value at once, each naming its
// key. config.toml at the repository root documents the same keys.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/probe"
)

// Duration is a time.Duration written in config files as "5s", "250ms"...
type Duration time.Duration

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q (write it like \"5s\" or \"250ms\")", string(b))
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Config is the whole of config.toml; config.toml at the repository root
// documents every key and its default.
type Config struct {
	Node      Node      `toml:"node"`
	Gossip    Gossip    `toml:"gossip"`
	Allreduce Allreduce `toml:"allreduce"`
	Train     Train     `toml:"train"`
	Probe     Probe     `toml:"probe"`
	Log       Log       `toml:"log"`
}

// Probe is the [probe] section: background link measurements and the
// ring layout built on them.
type Probe struct {
	// Enabled turns this peer's probing on (it always answers others' probes).
	Enabled bool `toml:"enabled"`
	// Interval is the least time between two probes of the same peer.
	Interval Duration `toml:"interval"`
	// MaxBytes bounds one probe upload (sizes adapt so a probe takes ~100 ms).
	MaxBytes int `toml:"max_bytes"`
	// DutyCycle is the largest share of time this peer spends probing.
	DutyCycle float64 `toml:"duty_cycle"`
	// ReplanInterval is the least time between two ring epochs the coordinator
	// proposes for unchanged members because measurements make a materially
	// faster layout possible; 0 re-plans only on membership changes.
	ReplanInterval Duration `toml:"replan_interval"`
}

// Train is the [train] section: what the cluster trains and how.
type Train struct {
	// Trainer: "builtin" trains train.model itself; "external" all-reduces
	// the gradients of a local training process (the PyTorch bridge) that
	// connects to Socket.
	Trainer string `toml:"trainer"`
	// Socket is the Unix-domain socket an external trainer connects to
	// ("": a per-user path named after node.api's port).
	Socket string `toml:"socket"`
	// Model: "mlp" or "cnn".
	Model string `toml:"model"`
	// Hidden widths of the mlp.
	Hidden []int `toml:"hidden"`
	// Steps to train; 0 runs the peer without training (membership only).
	Steps int `toml:"steps"`
	// BatchSize per local device.
	BatchSize int `toml:"batch_size"`
	// LR is the peak learning rate.
	LR float64 `toml:"lr"`
	// Optimizer: sgd (with momentum), nesterov or adamw.
	Optimizer string `toml:"optimizer"`
	// Momentum for sgd and nesterov.
	Momentum float64 `toml:"momentum"`
	// WeightDecay (decoupled for adamw).
	WeightDecay float64 `toml:"weight_decay"`
	// WarmupSteps of linear learning-rate warm-up, then cosine decay to the end.
	WarmupSteps int `toml:"warmup_steps"`
	// LowRankWarmupSteps: a low-rank codec (powersgd, acpsgd) starts after
	// max(WarmupSteps, LowRankWarmupSteps) steps all-reduced in fp32.
	LowRankWarmupSteps int `toml:"lowrank_warmup_steps"`
	// ClipNorm clips the global gradient norm (0: off).
	ClipNorm float64 `toml:"clip_norm"`
	// Dropout is the drop probability of a dropout layer before the
	// model's last dense layer (0: none).
	Dropout float64 `toml:"dropout"`
	// Seed shared by the cluster: initialisation and data order.
	Seed uint64 `toml:"seed"`
	// Devices: ["cpu"], or ["cpu:0", "cpu:1"] for several local devices.
	Devices []string `toml:"devices"`
	// DataDir holds the Fashion-MNIST IDX files ("" searches the usual places).
	DataDir string `toml:"data_dir"`
	// Data is the gpt's text corpus: a file, or a directory read
	// recursively ("" : the Go standard library's source, which every
	// machine that builds p2ptrain has).
	Data string `toml:"data"`
	// DataExt filters the files of a Data directory by extension.
	DataExt []string `toml:"data_ext"`
	// DataMaxBytes caps the bytes read from Data (0: all).
	DataMaxBytes int64 `toml:"data_max_bytes"`
	// GPT is the gpt's shape ([train.gpt]).
	GPT GPT `toml:"gpt"`
	// TrainSamples limits training to the first N samples (0: all).
	TrainSamples int `toml:"train_samples"`
	// EvalEvery evaluates on the test set every N steps (0: only at the end).
	EvalEvery int `toml:"eval_every"`
	// EvalSamples limits evaluation to the first N test samples (0: all 10k).
	EvalSamples int `toml:"eval_samples"`
	// CheckEvery gossips a parameter hash every N steps (0: off).
	CheckEvery int `toml:"check_every"`
	// MinPeers: members a ring epoch needs before it trains.
	MinPeers int `toml:"min_peers"`
	// CheckpointDir: where checkpoints go ("" : none); the latest is resumed.
	CheckpointDir string `toml:"checkpoint_dir"`
	// CheckpointEvery writes a checkpoint every N steps (0: only at the end).
	CheckpointEvery int `toml:"checkpoint_every"`
	// ExcludeAfter is how many consecutive failed steps blamed on one
	// member (a late, missing or invalid frame from it) make this peer
	// exclude it from ring epochs for gossip.exclude_for.
	ExcludeAfter int `toml:"exclude_after"`
	// ReadyTimeout bounds the wait for every member of a new ring epoch to
	// announce itself ready; members still silent then are excluded.
	ReadyTimeout Duration `toml:"ready_timeout"`
	// SyncEvery is DiLoCo's H: with H > 1 each peer takes H inner steps on
	// its own shards, then the pseudo-gradients are all-reduced and an
	// outer optimizer updates the shared parameters (1: all-reduce every
	// step). Steps must be a multiple of it; eval_every, check_every and
	// checkpoint_every then count outer steps.
	SyncEvery int `toml:"sync_every"`
	// OuterLR and OuterMomentum are the outer optimizer's (SGD with
	// Nesterov momentum) learning rate and momentum when SyncEvery > 1.
	OuterLR       float64 `toml:"outer_lr"`
	OuterMomentum float64 `toml:"outer_momentum"`
	// OuterOverlap runs each outer step's inner steps while the previous
	// outer step's all-reduce is in flight; its outer update reaches them
	// one outer step late.
	OuterOverlap bool `toml:"outer_overlap"`
	// PipelineStages cuts the model into this many stages on consecutive
	// members of the ring epoch (docs/pipeline.md); 1 is pure data
	// parallelism, StagesAuto ("auto") lets the ring coordinator choose
	// when training starts.
	PipelineStages Stages `toml:"pipeline_stages"`
	// PipelineSplit, when set, is the cut of the model's layers into the
	// PipelineStages stages: stage s holds layers [PipelineSplit[s],
	// PipelineSplit[s+1]), from 0 to the layer count (`p2ptrain plan`
	// prints one balanced by measured times). Empty: balanced by the
	// layers' parameter counts.
	PipelineSplit []int `toml:"pipeline_split"`
	// MicroBatches is the number of micro-batches a pipeline cuts each
	// step's batch_size samples into (with PipelineStages > 1).
	MicroBatches int `toml:"micro_batches"`
	// ActivationCodec encodes the activations and their gradients between
	// stages: none, fp16, bf16, int8, dyn8 or qsgd.
	ActivationCodec string `toml:"activation_codec"`
	// ActivationLinkCodecs is ActivationLinkCodecsOff (every link carries
	// ActivationCodec) or ActivationLinkCodecsAuto (each link carries the
	// most exact of none, bf16 and ActivationCodec whose transfer hides
	// under the stage's compute, from the link's measured rate).
	ActivationLinkCodecs string `toml:"activation_link_codecs"`
	// PipelineSchedule orders a stage's micro-batches: 1f1b or gpipe.
	PipelineSchedule string `toml:"pipeline_schedule"`
}

// Values of train.activation_link_codecs.
const (
	ActivationLinkCodecsOff  = "off"
	ActivationLinkCodecsAuto = "auto"
)

// Stages is train.pipeline_stages: a number of stages (1: pure data
// parallelism), or StagesAuto. In the file it is an integer or the string
// "auto".
type Stages int

// StagesAuto is train.pipeline_stages = "auto": the ring coordinator
// chooses the number of stages when training starts, from the projection
// of every layout (docs/pipeline.md). Its value is one no integer of a
// config file takes by mistake (integers skip UnmarshalText).
const StagesAuto Stages = math.MinInt32

// Auto reports whether s is "auto".
func (s Stages) Auto() bool { return s == StagesAuto }

// String returns "auto" or the number.
func (s Stages) String() string {
	if s.Auto() {
		return "auto"
	}
	return strconv.Itoa(int(s))
}

// MarshalText writes "auto" or the number.
func (s Stages) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads "auto" or a number written as text (a TOML integer
// does not come here: the decoder stores it as it is).
func (s *Stages) UnmarshalText(b []byte) error {
	if string(b) == "auto" {
		*s = StagesAuto
		return nil
	}
	n, err := strconv.Atoi(string(b))
	if err != nil || n == int(StagesAuto) {
		return fmt.Errorf("train.pipeline_stages: %q is not a number of stages or \"auto\"", string(b))
	}
	*s = Stages(n)
	return nil
}

// GPT is the [train.gpt] section: the decoder-only transformer's shape.
type GPT struct {
	// Layers is the number of transformer blocks.
	Layers int `toml:"layers"`
	// DModel is the width of the residual stream, a multiple of Heads.
	DModel int `toml:"d_model"`
	// Heads is the number of attention heads.
	Heads int `toml:"heads"`
	// Context is the number of byte tokens per sample.
	Context int `toml:"context"`
	// Vocab is the number of token values (at most 256: bytes).
	Vocab int `toml:"vocab"`
}

// Allreduce is the [allreduce] section: how gradients cross the ring.
type Allreduce struct {
	// Codec is the gradient codec spec ("none", "sint8", "qsgd:bits=4", ...).
	Codec string `toml:"codec"`
	// Schedule: auto, ring, direct, allgather, proportional or hier.
	Schedule string `toml:"schedule"`
	// LinkCodecs chooses per-link codecs of the ring schedule: "auto"
	// (stronger compression of the same family on links at least
	// allreduce.SlowLink times slower than the fastest ring edge), "off", or
	// a linear or quantized codec spec used on those slow links instead.
	LinkCodecs string `toml:"link_codecs"`
	// DirectLinks sends each all-reduce link's frames, and each link's
	// between pipeline stages, over a TCP connection of its own, sealed with AES-256-GCM under a key exchanged over the
	// libp2p stream, where the two peers reach each other by TCP (else, or
	// when false, over the libp2p stream).
	DirectLinks bool `toml:"direct_links"`
	// ChunkBytes is the pipeline chunk (fp32 bytes per frame).
	ChunkBytes int `toml:"chunk_bytes"`
	// BucketBytes is the fusion bucket size (fp32 bytes).
	BucketBytes int `toml:"bucket_bytes"`
	// Concurrency bounds the buckets reduced at once.
	Concurrency int `toml:"concurrency"`
	// FrameTimeout is the deadline for each awaited frame; "0s" derives it
	// from the measured bandwidth and the bucket size.
	FrameTimeout Duration `toml:"frame_timeout"`
	// Robust is the robust aggregation: "off" (the plain mean) or
	// "centered_clip" (each part's owner clips every member's contribution
	// around a robust centre; the direct schedule).
	Robust string `toml:"robust"`
	// RobustTau is centered clipping's radius τ per fusion bucket.
	RobustTau float64 `toml:"robust_tau"`
	// RobustIters is centered clipping's iteration count.
	RobustIters int `toml:"robust_iters"`
}

// Robust aggregation names (allreduce.robust).
const (
	RobustOff          = "off"
	RobustCenteredClip = "centered_clip"
)

// robust returns the engine's robust aggregation (nil: off).
func (a Allreduce) robust() *allreduce.Robust {
	if a.Robust != RobustCenteredClip {
		return nil
	}
	return &allreduce.Robust{Tau: a.RobustTau, Iters: a.RobustIters}
}

// RobustSpec returns the robust aggregation as one canonical string
// ("off", or "centered_clip:tau=T,iters=L"), for the cluster's settings.
func (a Allreduce) RobustSpec() string {
	if r := a.robust(); r != nil {
		return fmt.Sprintf("%s:tau=%g,iters=%d", RobustCenteredClip, r.Tau, r.Iters)
	}
	return RobustOff
}

// Session returns the allreduce configuration of these settings.
func (a Allreduce) Session(log *zap.Logger) allreduce.Config {
	sch, _ := allreduce.ParseSchedule(a.Schedule) // validated by Config.Validate
	return allreduce.Config{
		ChunkBytes:   a.ChunkBytes,
		Schedule:     sch,
		Concurrency:  a.Concurrency,
		FrameTimeout: a.FrameTimeout.D(),
		Robust:       a.robust(),
		Logger:       log,
	}
}

// Values of node.swarm_key_mode.
const (
	// SwarmKeyNoise binds the swarm key into the Noise handshake (its
	// prologue): only holders of the key complete it, and Noise alone
	// encrypts the connection.
	SwarmKeyNoise = "noise"
	// SwarmKeyPnet is libp2p's private network: the key's XSalsa20 stream
	// cipher under Noise or TLS, so every byte is encrypted twice.
	SwarmKeyPnet = "pnet"
)

// Node is the [node] section: identity, network and discovery.
type Node struct {
	// Cluster names the training cluster; peers of other clusters are ignored.
	Cluster string `toml:"cluster"`
	// Name is a human-readable peer name (default: the host name).
	Name string `toml:"name"`
	// Listen multiaddrs (TCP).
	Listen []string `toml:"listen"`
	// Bootstrap multiaddrs, each ending in /p2p/<peer-id>.
	Bootstrap []string `toml:"bootstrap"`
	// SwarmKey is the path of a private-network key file (p2ptrain keygen --swarm-key).
	SwarmKey string `toml:"swarm_key"`
	// SwarmKeyMode is how the swarm key keeps others out: SwarmKeyNoise
	// (bound into the Noise handshake; Noise alone encrypts) or
	// SwarmKeyPnet (libp2p's private network: a second stream cipher under
	// the security protocol). docs/protocols.md compares them.
	SwarmKeyMode string `toml:"swarm_key_mode"`
	// Identity is the path of a persistent Ed25519 key (p2ptrain keygen --identity);
	// empty: a fresh identity each start.
	Identity string `toml:"identity"`
	// Open allows listening on non-loopback addresses without a swarm key.
	Open bool `toml:"open"`
	// MDNS enables LAN discovery.
	MDNS bool `toml:"mdns"`
	// API is the local HTTP API address; empty turns it off.
	API string `toml:"api"`
	// APIPublic allows the API on a non-loopback address (it has no
	// authentication: anyone who reaches it sees the cluster's status).
	APIPublic bool `toml:"api_public"`
	// MaxPeers bounds the cluster size this peer connects to in full mesh.
	MaxPeers int `toml:"max_peers"`
	// RelayClient lets this peer reach and be reached through circuit
	// relay v2 relays (bootstrap peers and members that run RelayService)
	// when it cannot accept inbound connections (docs/nat.md).
	RelayClient bool `toml:"relay_client"`
	// HolePunching upgrades relayed connections to direct ones with DCUtR.
	HolePunching bool `toml:"hole_punching"`
	// RelayService relays for the cluster's members behind NAT while this
	// peer is publicly reachable; it needs a swarm key (its relayed
	// connections have no data or time limit, docs/nat.md).
	RelayService bool `toml:"relay_service"`
	// Reachability is ReachabilityAuto (AutoNAT finds out), or
	// ReachabilityPublic / ReachabilityPrivate when the operator knows.
	Reachability string `toml:"reachability"`
	// Announce lists addresses advertised besides the listen and observed
	// ones (a public address forwarded to this peer's listen port).
	Announce []string `toml:"announce"`
	// PublicNets are IPv4 ranges inside the private ranges that are
	// routable between the cluster's sites; NAT traversal treats them as
	// public. Process-wide (it changes what go-multiaddr calls private).
	PublicNets []string `toml:"public_nets"`
	// Observer keeps this peer out of ring epochs: it follows the cluster
	// but never trains or coordinates (`p2ptrain join` without train.steps).
	// Not a file key: the command sets it.
	Observer bool `toml:"-"`
	// AwaitApp keeps this peer out of ring epochs, like an observer, until
	// its application announced a payload (Node.Announce): a trainer still
	// loading its data or waiting for its PyTorch process would otherwise
	// be put in a ring, miss train.ready_timeout and be excluded for
	// gossip.exclude_for. Not a file key: `join` sets it when it trains.
	AwaitApp bool `toml:"-"`
}

// Gossip is the [gossip] section: heartbeats and failure detection.
type Gossip struct {
	// Heartbeat is the interval between heartbeats.
	Heartbeat Duration `toml:"heartbeat"`
	// FailureTimeout is the silence after which a peer is declared dead.
	FailureTimeout Duration `toml:"failure_timeout"`
	// ExcludeFor is the first back-off of a member excluded from ring
	// epochs (train.exclude_after); it doubles with each repeat, up to 16×.
	ExcludeFor Duration `toml:"exclude_for"`
}

// Log is the [log] section.
type Log struct {
	// Level: debug, info, warn or error.
	Level string `toml:"level"`
	// Format: console or json.
	Format string `toml:"format"`
	// MetricsFile, when set, receives every step, evaluation and event
	// record of the run as JSON Lines (created or truncated at start; its
	// directory must exist).
	MetricsFile string `toml:"metrics_file"`
}

// validateMetricsFile checks that log.metrics_file, when set, names a file
// in a directory that exists, and not a directory itself.
func (l *Log) validateMetricsFile(bad func(key, format string, args ...any)) {
	if l.MetricsFile == "" {
		return
	}
	if st, err := os.Stat(l.MetricsFile); err == nil && st.IsDir() {
		bad("log.metrics_file", "%q is a directory; name a file in it", l.MetricsFile)
		return
	}
	dir := filepath.Dir(l.MetricsFile)
	if st, err := os.Stat(dir); err != nil {
		bad("log.metrics_file", "directory of %q: %v", l.MetricsFile, err)
	} else if !st.IsDir() {
		bad("log.metrics_file", "%q: %s is not a directory", l.MetricsFile, dir)
	}
}

// DefaultConfig returns the defaults documented in config.toml.
func DefaultConfig() Config {
	return Config{
		Node: Node{
			Cluster:   "p2ptrain",
			Listen:    []string{"/ip4/0.0.0.0/tcp/4001"},
			Bootstrap: []string{},
			MDNS:      true,
			API:       "127.0.0.1:7420",
			MaxPeers:  64,

			SwarmKeyMode: SwarmKeyNoise,

			RelayClient:  true,
			HolePunching: true,
			Reachability: ReachabilityAuto,
			Announce:     []string{},
			PublicNets:   []string{},
		},
		Gossip: Gossip{
			Heartbeat:      Duration(time.Second),
			FailureTimeout: Duration(5 * time.Second),
			ExcludeFor:     Duration(gossip.DefaultExcludeFor),
		},
		Allreduce: Allreduce{
			Codec:       "none",
			Schedule:    "auto",
			LinkCodecs:  plan.LinkCodecsAuto,
			DirectLinks: true,
			ChunkBytes:  allreduce.DefaultChunkBytes,
			BucketBytes: allreduce.DefaultBucketBytes,
			Concurrency: allreduce.DefaultConcurrency,
			Robust:      RobustOff,
			RobustTau:   1,
			RobustIters: 3,
		},
		Train: Train{
			Trainer:              TrainerBuiltin,
			Model:                "mlp",
			Hidden:               []int{1024, 1024},
			Steps:                0,
			BatchSize:            64,
			LR:                   0.05,
			Optimizer:            "sgd",
			Momentum:             0.9,
			WeightDecay:          0,
			WarmupSteps:          50,
			LowRankWarmupSteps:   200,
			Seed:                 1,
			Devices:              []string{"cpu"},
			EvalEvery:            200,
			CheckEvery:           50,
			MinPeers:             1,
			ExcludeAfter:         2,
			ReadyTimeout:         Duration(30 * time.Second),
			DataExt:              []string{".go"},
			GPT:                  GPT{Layers: 4, DModel: 256, Heads: 4, Context: 128, Vocab: 256},
			SyncEvery:            1,
			OuterLR:              0.7,
			OuterMomentum:        0.9,
			PipelineStages:       1,
			PipelineSplit:        []int{},
			MicroBatches:         4,
			ActivationCodec:      "dyn8",
			ActivationLinkCodecs: ActivationLinkCodecsOff,
			PipelineSchedule:     "1f1b",
		},
		Probe: Probe{
			Enabled:        true,
			Interval:       Duration(30 * time.Second),
			MaxBytes:       4 << 20,
			DutyCycle:      0.02,
			ReplanInterval: Duration(time.Minute),
		},
		Log: Log{Level: "info", Format: "console"},
	}
}

// MinHeartbeat is the shortest heartbeat interval accepted.
const MinHeartbeat = 10 * time.Millisecond

// checkDuration reports a duration outside [lo, hi] under key and returns
// whether it was inside. A value below a microsecond most likely came from
// a bare TOML integer, which counts nanoseconds: the message says so.
func checkDuration(bad func(key, format string, args ...any), key string, d, lo, hi time.Duration) bool {
	switch {
	case d > 0 && d < time.Microsecond:
		bad(key, "%s is below %s: a bare number counts nanoseconds; write a duration string such as \"%s\"", d, lo, lo*100)
	case d < lo || d > hi:
		bad(key, "%s is outside %s..%s", d, lo, hi)
	default:
		return true
	}
	return false
}

// Validate reports every invalid value at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Node.Cluster == "" {
		bad("node.cluster", "must not be empty")
	} else if strings.ContainsAny(c.Node.Cluster, "/ \t\n") || len(c.Node.Cluster) > 64 {
		bad("node.cluster", "%q must be at most 64 characters without slashes or spaces", c.Node.Cluster)
	}
	if len(c.Node.Name) > 64 {
		bad("node.name", "longer than 64 characters")
	}
	if len(c.Node.Listen) == 0 {
		bad("node.listen", "needs at least one address")
	}
	for i, s := range c.Node.Listen {
		a, err := ParseListenAddr(s)
		if err != nil {
			bad(fmt.Sprintf("node.listen[%d]", i), "%v", err)
			continue
		}
		if c.Node.SwarmKey == "" && !c.Node.Open && !IsLoopback(a) {
			bad(fmt.Sprintf("node.listen[%d]", i), "refusing to listen on %s without a swarm key: anyone who can reach it could join.\n"+
				"  Create a key with `p2ptrain keygen --swarm-key swarm.key`, copy it to every machine and pass --swarm-key swarm.key,\n"+
				"  or set open = true in [node] (or pass --open) to run an open cluster; loopback addresses need neither", s)
		}
	}
	for i, s := range c.Node.Bootstrap {
		if _, err := ParseBootstrapAddr(s); err != nil {
			bad(fmt.Sprintf("node.bootstrap[%d]", i), "%v", err)
		}
	}
	if c.Node.API != "" {
		host, port, err := net.SplitHostPort(c.Node.API)
		switch {
		case err != nil:
			bad("node.api", "%q is not HOST:PORT (use \"\" to turn the API off)", c.Node.API)
		case !validPort(port):
			bad("node.api", "%q: port %s is not a number in 0..65535", c.Node.API, port)
		case !c.Node.APIPublic && !loopbackHost(host):
			bad("node.api", "%q is not a loopback address; the API has no authentication: set node.api_public = true (--api-public) to serve it there anyway", c.Node.API)
		default:
			if s, ok := listensOn(c.Node.Listen, host, port); ok {
				bad("node.api", "%q takes the TCP port that node.listen's %s takes: give the API another port (or \"\" to turn it off)", c.Node.API, s)
			}
		}
	}
	if c.Node.MaxPeers < 1 || c.Node.MaxPeers > 1024 {
		bad("node.max_peers", "%d is outside 1..1024", c.Node.MaxPeers)
	}
	switch c.Node.SwarmKeyMode {
	case SwarmKeyNoise, SwarmKeyPnet:
	default:
		bad("node.swarm_key_mode", "%q is not %s (the key bound into the Noise handshake) or %s (libp2p's private network, a second cipher)",
			c.Node.SwarmKeyMode, SwarmKeyNoise, SwarmKeyPnet)
	}
	c.Node.validateNAT(bad)
	hb, ft := c.Gossip.Heartbeat.D(), c.Gossip.FailureTimeout.D()
	hbOK := checkDuration(bad, "gossip.heartbeat", hb, MinHeartbeat, time.Minute)
	if checkDuration(bad, "gossip.failure_timeout", ft, 2*MinHeartbeat, 10*time.Minute) && hbOK && ft < 2*hb {
		bad("gossip.failure_timeout", "%s must be at least twice gossip.heartbeat (%s)", ft, hb)
	}
	checkDuration(bad, "gossip.exclude_for", c.Gossip.ExcludeFor.D(), time.Second, time.Hour)
	if err := compress.Validate(c.Allreduce.Codec); err != nil {
		bad("allreduce.codec", "%v", err)
	}
	if _, err := allreduce.ParseSchedule(c.Allreduce.Schedule); err != nil {
		bad("allreduce.schedule", "%v", err)
	}
	if err := plan.ValidateLinkCodecs(c.Allreduce.LinkCodecs, c.Allreduce.Codec); err != nil {
		bad("allreduce.link_codecs", "%v", err)
	}
	if c.Allreduce.ChunkBytes < 4096 || c.Allreduce.ChunkBytes > 64<<20 || c.Allreduce.ChunkBytes%4 != 0 {
		bad("allreduce.chunk_bytes", "%d must be a multiple of 4 between 4096 and 64 MiB", c.Allreduce.ChunkBytes)
	}
	if c.Allreduce.BucketBytes < c.Allreduce.ChunkBytes || c.Allreduce.BucketBytes > 1<<30 {
		bad("allreduce.bucket_bytes", "%d must be between allreduce.chunk_bytes and 1 GiB", c.Allreduce.BucketBytes)
	}
	if c.Allreduce.Concurrency < 1 || c.Allreduce.Concurrency > 64 {
		bad("allreduce.concurrency", "%d is outside 1..64", c.Allreduce.Concurrency)
	}
	c.Allreduce.validateRobust(bad)
	if ftm := c.Allreduce.FrameTimeout.D(); ftm != 0 {
		checkDuration(bad, "allreduce.frame_timeout", ftm, 100*time.Millisecond, time.Hour)
	}
	c.Train.validate(bad)
	if mp := c.Node.MaxPeers; mp >= 1 && mp <= 1024 {
		// A member connects to at most node.max_peers others: a ring epoch
		// holds at most max_peers + 1 members.
		if c.Train.MinPeers > mp+1 {
			bad("train.min_peers", "%d members cannot form a ring epoch with node.max_peers = %d (each member connects to at most %d others: at most %d members)",
				c.Train.MinPeers, mp, mp, mp+1)
		}
		if s := c.Train.PipelineStages; !s.Auto() && int(s) > mp+1 {
			bad("train.pipeline_stages", "%d stages need %d members; node.max_peers = %d allows at most %d (each member connects to at most %d others)",
				s, s, mp, mp+1, mp)
		}
	}
	if c.Train.PipelineStages.Auto() && compress.Validate(c.Allreduce.Codec) == nil {
		if _, err := pipeline.CodecCostOf(c.Allreduce.Codec); err != nil {
			bad("allreduce.codec", "train.pipeline_stages = auto projects each layout's all-reduce from the codec's size: %v", err)
		}
	}
	if iv := c.Probe.Interval.D(); iv < time.Second || iv > 24*time.Hour {
		bad("probe.interval", "%s is outside 1s..24h", iv)
	}
	if c.Probe.MaxBytes < probe.MinBytes || c.Probe.MaxBytes > probe.MaxBytes {
		bad("probe.max_bytes", "%d is outside %d..%d", c.Probe.MaxBytes, probe.MinBytes, probe.MaxBytes)
	}
	if !(c.Probe.DutyCycle > 0 && c.Probe.DutyCycle <= 0.5) {
		bad("probe.duty_cycle", "%g must be in (0, 0.5]", c.Probe.DutyCycle)
	}
	if c.Probe.ReplanInterval < 0 {
		bad("probe.replan_interval", "must not be negative, got %s", c.Probe.ReplanInterval.D())
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "console", "json":
	default:
		bad("log.format", "%q is not one of console, json", c.Log.Format)
	}
	c.Log.validateMetricsFile(bad)
	return errors.Join(errs...)
}

// ParseListenAddr parses a TCP listen multiaddr.
func ParseListenAddr(s string) (ma.Multiaddr, error) {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return nil, fmt.Errorf("invalid multiaddr %q: %v", s, err)
	}
	if _, err := a.ValueForProtocol(ma.P_TCP); err != nil {
		return nil, fmt.Errorf("%q is not a TCP address (p2ptrain listens on TCP, e.g. /ip4/0.0.0.0/tcp/4001)", s)
	}
	// libp2p's TCP transport takes an IP or DNS name and a TCP port, and
	// nothing after them (no /ws, no /p2p/<peer-id>).
	if len(a) != 2 || !slices.Contains([]int{ma.P_IP4, ma.P_IP6, ma.P_DNS, ma.P_DNS4, ma.P_DNS6}, a[0].Code()) || a[1].Code() != ma.P_TCP {
		return nil, fmt.Errorf("%q is not a plain TCP address: write /ip4/HOST/tcp/PORT, /ip6/HOST/tcp/PORT or /dns4/NAME/tcp/PORT and nothing after it (e.g. /ip4/0.0.0.0/tcp/4001)", s)
	}
	return a, nil
}

// listensOn returns the node.listen address that surely takes TCP port
// port on host as well, if any: the API could not bind it. An API on all
// addresses ("" or an unspecified IP: Go listens on both families) clashes
// with every listen address on its port; another API address with one of
// the same family on all addresses, or on that address. A listen address
// on /dns*/localhost is the loopback one; other names, and port 0 (any free
// port), clash with none.
func listensOn(listen []string, host, port string) (string, bool) {
	p, err := strconv.Atoi(port)
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	all := host == "" || ip != nil && ip.IsUnspecified()
	if err != nil || p == 0 || ip == nil && !all {
		return "", false
	}
	for _, s := range listen {
		a, err := ParseListenAddr(s)
		if err != nil {
			continue
		}
		lport, _ := a.ValueForProtocol(ma.P_TCP)
		lhost, _ := a.ValueForProtocol(a[0].Code())
		if c := a[0].Code(); c != ma.P_IP4 && c != ma.P_IP6 && lhost == "localhost" {
			lhost = "127.0.0.1"
		}
		lip := net.ParseIP(lhost)
		if lp, err := strconv.Atoi(lport); err != nil || lp != p || lip == nil {
			continue
		}
		if all || lip.Equal(ip) || lip.IsUnspecified() && (lip.To4() == nil) == (ip.To4() == nil) {
			return s, true
		}
	}
	return "", false
}

// validPort reports whether port (from HOST:PORT) is a TCP port number.
func validPort(port string) bool {
	_, err := strconv.ParseUint(port, 10, 16)
	return err == nil
}

// ParseBootstrapAddr parses a bootstrap multiaddr, which must name the peer.
func ParseBootstrapAddr(s string) (ma.Multiaddr, error) {
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return nil, fmt.Errorf("invalid multiaddr %q: %v", s, err)
	}
	if _, err := a.ValueForProtocol(ma.P_P2P); err != nil {
		return nil, fmt.Errorf("%q does not end in /p2p/<peer-id> (copy an address that `p2ptrain join` printed)", s)
	}
	return a, nil
}

func (a *Allreduce) validateRobust(bad func(key, format string, args ...any)) {
	// τ is only used with centered_clip, but NaN or ±Inf is never meant.
	if tau := a.RobustTau; math.IsNaN(tau) || math.IsInf(tau, 0) || (a.Robust == RobustCenteredClip && !(tau > 0)) {
		bad("allreduce.robust_tau", "%g must be a positive number", tau)
	}
	switch a.Robust {
	case RobustOff:
		return
	case RobustCenteredClip:
	default:
		bad("allreduce.robust", "%q is not one of %s, %s", a.Robust, RobustOff, RobustCenteredClip)
		return
	}
	if a.RobustIters < 1 || a.RobustIters > 100 {
		bad("allreduce.robust_iters", "%d is outside 1..100", a.RobustIters)
	}
	if c, err := compress.New(a.Codec, compress.Options{Layout: compress.Layout{Shapes: [][]int{{16, 16}}}}); err == nil {
		switch c.Class() {
		case compress.ClassLinear, compress.ClassQuantized, compress.ClassErrorFeedback:
		default:
			bad("allreduce.robust", "needs each member's contribution at its owner: codec %q (%v) does not give it; use a linear, quantized or error-feedback codec (none, fp16, int8, sint8, dyn8, qsgd, onebit, sign)", a.Codec, c.Class())
		}
	}
	switch a.Schedule {
	case "", "auto", string(allreduce.ScheduleDirect), string(allreduce.ScheduleProportional):
	default:
		bad("allreduce.schedule", "%q cannot carry allreduce.robust (it needs direct or proportional; auto picks direct)", a.Schedule)
	}
}

// The trainers train.trainer names.
const (
	TrainerBuiltin  = "builtin"
	TrainerExternal = "external"
)

func (t *Train) validate(bad func(key, format string, args ...any)) {
	switch t.Trainer {
	case TrainerBuiltin, TrainerExternal:
	default:
		bad("train.trainer", "%q is not builtin or external", t.Trainer)
	}
	if t.Socket != "" && (!filepath.IsAbs(t.Socket) || len(t.Socket) > 100) {
		bad("train.socket", "%q must be an absolute path of at most 100 bytes (a Unix socket's limit)", t.Socket)
	}
	if !slices.Contains(model.Names(), t.Model) {
		bad("train.model", "%q is not one of %s", t.Model, strings.Join(model.Names(), ", "))
	}
	if len(t.Hidden) == 0 || len(t.Hidden) > 8 || slices.ContainsFunc(t.Hidden, func(h int) bool { return h < 1 || h > 1<<14 }) {
		bad("train.hidden", "%v must list 1 to 8 widths between 1 and 16384", t.Hidden)
	}
	for _, c := range []struct {
		key    string
		v, min int
	}{
		{"train.steps", t.Steps, 0}, {"train.batch_size", t.BatchSize, 1}, {"train.warmup_steps", t.WarmupSteps, 0}, {"train.lowrank_warmup_steps", t.LowRankWarmupSteps, 0},
		{"train.train_samples", t.TrainSamples, 0}, {"train.eval_every", t.EvalEvery, 0}, {"train.eval_samples", t.EvalSamples, 0},
		{"train.check_every", t.CheckEvery, 0}, {"train.min_peers", t.MinPeers, 1}, {"train.checkpoint_every", t.CheckpointEvery, 0},
		{"train.exclude_after", t.ExcludeAfter, 1}, {"train.sync_every", t.SyncEvery, 1},
	} {
		if c.v < c.min {
			bad(c.key, "%d must be at least %d", c.v, c.min)
		}
	}
	if t.BatchSize > 4096 {
		bad("train.batch_size", "%d is above 4096", t.BatchSize)
	}
	if !(t.LR > 0 && t.LR < 100) {
		bad("train.lr", "%g must be in (0, 100)", t.LR)
	}
	if !slices.Contains(model.OptimizerNames(), t.Optimizer) {
		bad("train.optimizer", "%q is not one of %s", t.Optimizer, strings.Join(model.OptimizerNames(), ", "))
	}
	if !(t.Momentum >= 0 && t.Momentum < 1) {
		bad("train.momentum", "%g must be in [0, 1)", t.Momentum)
	}
	if !(t.WeightDecay >= 0 && t.WeightDecay < 1) {
		bad("train.weight_decay", "%g must be in [0, 1)", t.WeightDecay)
	}
	if !(t.ClipNorm >= 0) || math.IsInf(t.ClipNorm, 1) {
		bad("train.clip_norm", "%g must be a finite number, at least 0 (0: off)", t.ClipNorm)
	}
	if !(t.Dropout >= 0 && t.Dropout < 1) {
		bad("train.dropout", "%g must be in [0, 1)", t.Dropout)
	}
	checkDuration(bad, "train.ready_timeout", t.ReadyTimeout.D(), time.Second, time.Hour)
	t.GPT.validate(bad)
	if t.Data != "" {
		if _, err := os.Stat(t.Data); err != nil {
			bad("train.data", "%v", err)
		}
	}
	for i, e := range t.DataExt {
		if e == "" || strings.ContainsAny(e, "/\\") {
			bad(fmt.Sprintf("train.data_ext[%d]", i), "%q is not a file-name ending such as \".go\"", e)
		}
	}
	if t.DataMaxBytes < 0 {
		bad("train.data_max_bytes", "%d must not be negative", t.DataMaxBytes)
	}
	if t.SyncEvery > 1 {
		if t.Steps%t.SyncEvery != 0 {
			bad("train.sync_every", "%d must divide train.steps (%d): a run is a whole number of outer steps", t.SyncEvery, t.Steps)
		}
		if t.Trainer == TrainerExternal {
			bad("train.sync_every", "%d needs the built-in trainer (an external process keeps its own optimizer)", t.SyncEvery)
		}
	}
	if t.SyncEvery > 100000 {
		bad("train.sync_every", "%d is above 100000", t.SyncEvery)
	}
	if !(t.OuterLR > 0 && t.OuterLR < 100) {
		bad("train.outer_lr", "%g must be in (0, 100)", t.OuterLR)
	}
	if !(t.OuterMomentum >= 0 && t.OuterMomentum < 1) {
		bad("train.outer_momentum", "%g must be in [0, 1)", t.OuterMomentum)
	}
	t.validatePipeline(bad)
	if len(t.Devices) == 0 {
		bad("train.devices", "needs at least one device")
	}
	for i, d := range t.Devices {
		if _, err := gpu.ParseSpec(d); err != nil {
			bad(fmt.Sprintf("train.devices[%d]", i), "%v", err)
		}
	}
}

// validatePipeline reports the pipeline keys that are wrong, and the keys
// a pipeline of several stages cannot run with yet.
func (t *Train) validatePipeline(bad func(key, format string, args ...any)) {
	if _, err := pipeline.ParseSchedule(t.PipelineSchedule); err != nil {
		bad("train.pipeline_schedule", "%q is not 1f1b or gpipe", t.PipelineSchedule)
	}
	if err := pipeline.ValidateCodec(t.ActivationCodec); err != nil {
		bad("train.activation_codec", "%v", err)
	}
	if l := t.ActivationLinkCodecs; l != ActivationLinkCodecsOff && l != ActivationLinkCodecsAuto {
		bad("train.activation_link_codecs", "%q is not %q or %q", l, ActivationLinkCodecsOff, ActivationLinkCodecsAuto)
	}
	if t.MicroBatches < 1 {
		bad("train.micro_batches", "%d must be at least 1", t.MicroBatches)
	}
	s := t.PipelineStages
	if !s.Auto() && (s < 1 || s > 256) {
		bad("train.pipeline_stages", "%v must be in [1, 256] or \"auto\" (1: pure data parallelism; auto: the ring coordinator chooses when training starts)", s)
		return
	}
	if len(t.PipelineSplit) > 0 && (s.Auto() || s < 2) {
		bad("train.pipeline_split", "%v needs a fixed train.pipeline_stages of 2 or more, not %v (auto cuts by the coordinator's measured layer times)", t.PipelineSplit, s)
	}
	if s == 1 {
		return
	}
	// With auto, each pipeline takes S × batch_size samples and a number
	// of stages whose micro-batches do not fit is not a candidate.
	if !s.Auto() && t.MicroBatches > t.BatchSize {
		bad("train.micro_batches", "%d is above train.batch_size (%d): each of a pipeline's micro-batches needs a sample", t.MicroBatches, t.BatchSize)
	}
	cfg := model.Config{Hidden: t.Hidden, MaxBatch: 1, GPT: model.GPTConfig{Layers: t.GPT.Layers, DModel: t.GPT.DModel, Heads: t.GPT.Heads, Context: t.GPT.Context, Vocab: t.GPT.Vocab}}
	layers, err := model.Layers(t.Model, cfg)
	if !s.Auto() && err == nil && len(layers) < int(s) {
		bad("train.pipeline_stages", "%d stages need a model of at least %d layers; %s has %d (the gpt has train.gpt.layers + 3, the mlp len(train.hidden) + 1)", s, s, t.Model, len(layers))
	}
	if sp := pipeline.Split(t.PipelineSplit); len(sp) > 0 && !s.Auto() {
		switch {
		case sp.Stages() != int(s):
			bad("train.pipeline_split", "%v has %d boundaries; train.pipeline_stages = %d needs %d: 0, the first layer of every later stage, and the layer count", t.PipelineSplit, len(sp), s, int(s)+1)
		case err == nil:
			if err := sp.Check(len(layers)); err != nil {
				bad("train.pipeline_split", "%v: %s has %d layers: %v", t.PipelineSplit, t.Model, len(layers), err)
			}
		}
	}
	for _, c := range []struct {
		key string
		off bool
		why string
	}{
		{"train.trainer", t.Trainer == TrainerBuiltin, "a pipeline runs the built-in models"},
		{"train.sync_every", t.SyncEvery == 1, "DiLoCo does not run over pipeline stages yet"},
		{"train.devices", len(t.Devices) == 1, "a pipeline stage runs on one device per peer"},
		{"train.clip_norm", t.ClipNorm == 0, "clipping needs the global gradient norm across the stages, not written yet"},
		{"train.checkpoint_dir", t.CheckpointDir == "", "resuming a stage's checkpoint is not written yet"},
	} {
		if !c.off {
			bad(c.key, "cannot be used with train.pipeline_stages = %v: %s", s, c.why)
		}
	}
}

// validate reports the [train.gpt] keys out of range.
func (g GPT) validate(bad func(key, format string, args ...any)) {
	for _, c := range []struct {
		key         string
		v, min, max int
	}{
		{"train.gpt.layers", g.Layers, 1, 256}, {"train.gpt.d_model", g.DModel, 1, 1 << 14},
		{"train.gpt.heads", g.Heads, 1, 1 << 10}, {"train.gpt.context", g.Context, 2, 1 << 14},
		{"train.gpt.vocab", g.Vocab, 2, 256},
	} {
		if c.v < c.min || c.v > c.max {
			bad(c.key, "%d must be in [%d, %d]", c.v, c.min, c.max)
		}
	}
	if g.Heads > 0 && g.DModel%g.Heads != 0 {
		bad("train.gpt.d_model", "%d is not a multiple of train.gpt.heads (%d)", g.DModel, g.Heads)
	}
}

// loopbackHost reports whether host (from HOST:PORT) names only loopback:
// "localhost" or a loopback IP. An empty host means every interface.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// IsLoopback reports whether a is a loopback address (127.0.0.0/8, ::1 or
// the DNS name localhost).
func IsLoopback(a ma.Multiaddr) bool {
	ip, err := manet.ToIP(a)
	if err != nil {
		// DNS names: only "localhost" counts as loopback.
		v, err := a.ValueForProtocol(ma.P_DNS4)
		return err == nil && v == "localhost"
	}
	return ip.IsLoopback() && !ip.Equal(net.IPv4zero)
}

// Prober returns the probe protocol's settings.
func (p Probe) Prober() probe.Config {
	return probe.Config{Interval: p.Interval.D(), MaxBytes: p.MaxBytes, DutyCycle: p.DutyCycle}
}

// Planner returns the ring planner's settings.
func (a Allreduce) Planner() plan.Settings {
	return plan.Settings{Schedule: a.Schedule, BucketBytes: a.BucketBytes, Codec: a.Codec, LinkCodecs: a.LinkCodecs}
}
