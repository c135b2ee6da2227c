package node

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	ma "github.com/multiformats/go-multiaddr"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
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
	Node      NodeConfig      `toml:"node"`
	Gossip    GossipConfig    `toml:"gossip"`
	Allreduce AllreduceConfig `toml:"allreduce"`
	Log       LogConfig       `toml:"log"`
}

// AllreduceConfig is the [allreduce] section: how gradients cross the ring.
type AllreduceConfig struct {
	// Codec is the gradient codec spec ("none", "sint8", "qsgd:bits=4", ...).
	Codec string `toml:"codec"`
	// Schedule: auto, ring, direct, allgather or proportional.
	Schedule string `toml:"schedule"`
	// ChunkBytes is the pipeline chunk (fp32 bytes per frame).
	ChunkBytes int `toml:"chunk_bytes"`
	// BucketBytes is the fusion bucket size (fp32 bytes).
	BucketBytes int `toml:"bucket_bytes"`
	// Concurrency bounds the buckets reduced at once.
	Concurrency int `toml:"concurrency"`
	// FrameTimeout is the deadline for each awaited frame; "0s" derives it
	// from the measured bandwidth and the bucket size.
	FrameTimeout Duration `toml:"frame_timeout"`
}

// Session returns the allreduce configuration of these settings.
func (a AllreduceConfig) Session(log *zap.Logger) allreduce.Config {
	sch, _ := allreduce.ParseSchedule(a.Schedule) // validated by Config.Validate
	return allreduce.Config{
		ChunkBytes:   a.ChunkBytes,
		Schedule:     sch,
		Concurrency:  a.Concurrency,
		FrameTimeout: a.FrameTimeout.D(),
		Logger:       log,
	}
}

// NodeConfig is the [node] section: identity, network and discovery.
type NodeConfig struct {
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
	// Identity is the path of a persistent Ed25519 key (p2ptrain keygen --identity);
	// empty: a fresh identity each start.
	Identity string `toml:"identity"`
	// Open allows listening on non-loopback addresses without a swarm key.
	Open bool `toml:"open"`
	// MDNS enables LAN discovery.
	MDNS bool `toml:"mdns"`
	// API is the local HTTP API address; empty turns it off.
	API string `toml:"api"`
	// MaxPeers bounds the cluster size this peer connects to in full mesh.
	MaxPeers int `toml:"max_peers"`
}

// GossipConfig is the [gossip] section: heartbeats and failure detection.
type GossipConfig struct {
	// Heartbeat is the interval between heartbeats.
	Heartbeat Duration `toml:"heartbeat"`
	// FailureTimeout is the silence after which a peer is declared dead.
	FailureTimeout Duration `toml:"failure_timeout"`
}

// LogConfig is the [log] section.
type LogConfig struct {
	// Level: debug, info, warn or error.
	Level string `toml:"level"`
	// Format: console or json.
	Format string `toml:"format"`
}

// DefaultConfig returns the defaults documented in config.toml.
func DefaultConfig() Config {
	return Config{
		Node: NodeConfig{
			Cluster:   "p2ptrain",
			Listen:    []string{"/ip4/0.0.0.0/tcp/4001"},
			Bootstrap: []string{},
			MDNS:      true,
			API:       "127.0.0.1:7420",
			MaxPeers:  64,
		},
		Gossip: GossipConfig{
			Heartbeat:      Duration(time.Second),
			FailureTimeout: Duration(5 * time.Second),
		},
		Allreduce: AllreduceConfig{
			Codec:       "none",
			Schedule:    "auto",
			ChunkBytes:  allreduce.DefaultChunkBytes,
			BucketBytes: allreduce.DefaultBucketBytes,
			Concurrency: allreduce.DefaultConcurrency,
		},
		Log: LogConfig{Level: "info", Format: "console"},
	}
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
		if c.Node.SwarmKey == "" && !c.Node.Open && !isLoopback(a) {
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
		if _, _, err := net.SplitHostPort(c.Node.API); err != nil {
			bad("node.api", "%q is not HOST:PORT (use \"\" to turn the API off)", c.Node.API)
		}
	}
	if c.Node.MaxPeers < 1 || c.Node.MaxPeers > 1024 {
		bad("node.max_peers", "%d is outside 1..1024", c.Node.MaxPeers)
	}
	hb, ft := c.Gossip.Heartbeat.D(), c.Gossip.FailureTimeout.D()
	if hb <= 0 {
		bad("gossip.heartbeat", "must be positive, got %s", hb)
	}
	switch {
	case ft <= 0:
		bad("gossip.failure_timeout", "must be positive, got %s", ft)
	case hb > 0 && ft < 2*hb:
		bad("gossip.failure_timeout", "%s must be at least twice gossip.heartbeat (%s)", ft, hb)
	}
	if err := compress.Validate(c.Allreduce.Codec); err != nil {
		bad("allreduce.codec", "%v", err)
	}
	if _, err := allreduce.ParseSchedule(c.Allreduce.Schedule); err != nil {
		bad("allreduce.schedule", "%v", err)
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
	if c.Allreduce.FrameTimeout < 0 {
		bad("allreduce.frame_timeout", "must not be negative, got %s", c.Allreduce.FrameTimeout.D())
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
	return a, nil
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
