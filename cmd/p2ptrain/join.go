package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/gologshim"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"

	"github.com/p2ptrain/p2ptrain/bridge"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
	"github.com/p2ptrain/p2ptrain/telemetry"
	"github.com/p2ptrain/p2ptrain/train"
)

// peerFlags are the flags shared by every command that runs a peer.
type peerFlags struct {
	fs        *flag.FlagSet
	config    string
	sets      stringList
	bootstrap stringList
	listen    stringList
	swarmKey  string
	identity  string
	api       string
	name      string
	cluster   string
	open      bool
	apiPublic bool
	mdns      bool
	logLevel  string
	logFormat string
	model     string
	codec     string
	steps     int
	minPeers  int
	trainer   string
	socket    string
	metrics   string
}

func addPeerFlags(fs *flag.FlagSet) *peerFlags {
	p := &peerFlags{fs: fs}
	fs.StringVar(&p.config, "config", "", "read settings from TOML `FILE` (see config.toml)")
	fs.Var(&p.sets, "set", "set a config key, over the file and P2PTRAIN_<SECTION>_<KEY> variables: `SECTION.KEY=VALUE` "+
		"(repeatable; e.g. train.steps=100, train.hidden=256,256; docs/configuration.md)")
	fs.Var(&p.bootstrap, "bootstrap", "bootstrap `MULTIADDR` ending in /p2p/<peer-id> (repeatable)")
	fs.Var(&p.listen, "listen", "listen on TCP `MULTIADDR` (repeatable; default /ip4/0.0.0.0/tcp/4001)")
	fs.StringVar(&p.swarmKey, "swarm-key", "", "private-network key `FILE` (p2ptrain keygen --swarm-key)")
	fs.StringVar(&p.identity, "identity", "", "persistent identity `FILE` (p2ptrain keygen --identity)")
	fs.StringVar(&p.api, "api", "", "local HTTP API `HOST:PORT` (\"\" turns it off; default 127.0.0.1:7420)")
	fs.BoolVar(&p.apiPublic, "api-public", false, "allow the local API on a non-loopback address (it has no authentication)")
	fs.StringVar(&p.name, "name", "", "human-readable peer `NAME` (default: host name)")
	fs.StringVar(&p.cluster, "cluster", "", "cluster `NAME`; peers of other clusters are ignored")
	fs.BoolVar(&p.open, "open", false, "allow listening on non-loopback addresses without a swarm key")
	fs.BoolVar(&p.mdns, "mdns", true, "discover peers on the LAN with mDNS")
	fs.StringVar(&p.logLevel, "log-level", "", "log `LEVEL`: debug, info, warn, error")
	fs.StringVar(&p.logFormat, "log-format", "", "log `FORMAT`: console or json")
	fs.StringVar(&p.model, "model", "", "model to train: `NAME` mlp, cnn or gpt")
	fs.StringVar(&p.codec, "codec", "", "gradient codec `SPEC` (e.g. none, sint8, qsgd:bits=4)")
	fs.IntVar(&p.steps, "steps", 0, "training steps (0: join without training)")
	fs.IntVar(&p.minPeers, "min-peers", 0, "peers to wait for before the first step")
	fs.StringVar(&p.trainer, "trainer", "", "`KIND` builtin, or external: all-reduce for a local PyTorch process (docs/pytorch.md)")
	fs.StringVar(&p.socket, "socket", "", "Unix socket `PATH` the external training process connects to")
	fs.StringVar(&p.metrics, "metrics-file", "", "write every step, evaluation and event record to `FILE` as JSON Lines (docs/operating.md)")
	return p
}

// resolve loads the config file, applies the P2PTRAIN_ environment
// variables, --set and the other flags given on the command line, in that
// order, and checks the result (Validate, then preflight). Every problem is
// reported at once, as a usage error.
func (p *peerFlags) resolve() (config.Config, error) {
	cfg, err := loadConfig(p.config)
	var unknown unknownKeys
	src := sources{}
	oerr := applyOverrides(&cfg, os.Environ(), p.sets, src)
	if err != nil && !errors.As(err, &unknown) {
		// Without the file's settings the rest cannot be checked meaningfully.
		return cfg, usageError{errors.Join(err, oerr)}
	}
	set := setFlags(p.fs)
	if set["bootstrap"] {
		cfg.Node.Bootstrap = p.bootstrap
	}
	if set["listen"] {
		cfg.Node.Listen = p.listen
	}
	for name, apply := range map[string]func(){
		"swarm-key":    func() { cfg.Node.SwarmKey = p.swarmKey },
		"identity":     func() { cfg.Node.Identity = p.identity },
		"api":          func() { cfg.Node.API = p.api },
		"api-public":   func() { cfg.Node.APIPublic = p.apiPublic },
		"name":         func() { cfg.Node.Name = p.name },
		"cluster":      func() { cfg.Node.Cluster = p.cluster },
		"open":         func() { cfg.Node.Open = p.open },
		"mdns":         func() { cfg.Node.MDNS = p.mdns },
		"log-level":    func() { cfg.Log.Level = p.logLevel },
		"log-format":   func() { cfg.Log.Format = p.logFormat },
		"model":        func() { cfg.Train.Model = p.model },
		"codec":        func() { cfg.Allreduce.Codec = p.codec },
		"steps":        func() { cfg.Train.Steps = p.steps },
		"min-peers":    func() { cfg.Train.MinPeers = p.minPeers },
		"trainer":      func() { cfg.Train.Trainer = p.trainer },
		"socket":       func() { cfg.Train.Socket = p.socket },
		"metrics-file": func() { cfg.Log.MetricsFile = p.metrics },
	} {
		if set[name] {
			apply()
		}
	}
	for name := range set {
		if key, ok := flagKeys[name]; ok {
			src[key] = "--" + name
		}
	}
	errs := []error{oerr, src.annotate(cfg.Validate()), src.annotate(preflight(cfg))}
	if unknown != nil {
		errs = append([]error{fmt.Errorf("%s: %w", p.config, unknown)}, errs...)
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, usageError{fmt.Errorf("invalid configuration:\n%w", err)}
	}
	return cfg, nil
}

// flagKeys are the configuration keys that join's named flags set.
var flagKeys = map[string]string{
	"swarm-key":    "node.swarm_key",
	"identity":     "node.identity",
	"api":          "node.api",
	"api-public":   "node.api_public",
	"name":         "node.name",
	"cluster":      "node.cluster",
	"open":         "node.open",
	"mdns":         "node.mdns",
	"log-level":    "log.level",
	"log-format":   "log.format",
	"model":        "train.model",
	"codec":        "allreduce.codec",
	"steps":        "train.steps",
	"min-peers":    "train.min_peers",
	"trainer":      "train.trainer",
	"socket":       "train.socket",
	"metrics-file": "log.metrics_file",
	"bootstrap":    "node.bootstrap",
	"listen":       "node.listen",
}

// newLogger builds the process logger on stderr and routes libp2p's logs into it.
func newLogger(cfg config.Log, stderr io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.Level)
	if err != nil {
		return nil, usagef("log.level: %v", err)
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if cfg.Format == "json" {
		enc = zapcore.NewJSONEncoder(encCfg)
	} else {
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(stderr)), level)
	log := zap.New(core)
	// libp2p logs through slog; send it to zap, quieter than our own logs.
	libp2pLevel := max(level, zapcore.WarnLevel)
	gologshim.SetDefaultHandler(zapslog.NewHandler(
		zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(stderr)), libp2pLevel),
		zapslog.WithName("libp2p"),
		// libp2p's errors are reported again, with context, by the
		// error they cause: a stack trace of its internals helps nobody.
		zapslog.AddStacktraceAt(slog.Level(math.MaxInt32))))
	return log, nil
}

func cmdJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("join", stdout)
	pf := addPeerFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := pf.resolve()
	if err != nil {
		return err
	}
	// A peer that does not train must not enter a ring: it would stall
	// every step of the others.
	cfg.Node.Observer = cfg.Train.Steps == 0
	// A trainer enters rings once it is running (its first payload), not
	// while it loads data or waits for its training process.
	cfg.Node.AwaitApp = true
	// On a terminal the progress line stays at the bottom, below the logs.
	var live *liveLine
	logOut := stderr
	if isTerminal(stderr) && cfg.Train.Steps > 0 {
		live = &liveLine{w: stderr}
		logOut = live
	}
	n, log, leave, err := startPeer(ctx, cfg, stdout, logOut)
	if err != nil {
		return err
	}
	defer leave()
	mf, err := openMetricsFile(n, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := mf.Close(); err != nil {
			log.Error("metrics file", zap.Error(err))
		}
	}()
	if cfg.Train.Steps == 0 {
		<-ctx.Done()
		return nil
	}
	opts := train.Options{
		Log:       log,
		Progress:  progressPrinter(live, log),
		Status:    func(s train.Status) { n.SetTraining(trainingStatus(s)) },
		Linger:    cfg.Train.ReadyTimeout.D() + 2*cfg.Gossip.FailureTimeout.D(),
		Telemetry: n,
		MeasureWire: func(ctx context.Context) (float64, float64, error) {
			w, err := n.MeasureWireCost(ctx, wireRounds)
			return w.Message, w.Byte, err
		},
	}
	var res train.Result
	start := time.Now()
	if cfg.Train.Trainer == config.TrainerExternal {
		res, err = runExternal(ctx, n, cfg, opts, stdout)
	} else {
		res, err = runBuiltin(ctx, n, cfg, opts)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted: leave cleanly
		}
		return err
	}
	clearProgress(live)
	n.Add(telemetry.Record{Kind: telemetry.KindEvent, Step: res.Step, Event: telemetry.EventDone, Message: res.String()})
	sent, received := n.Traffic()
	fmt.Fprintln(stdout, runSummary(res, time.Since(start), sent, received))
	fmt.Fprintln(stdout, res) // the last line, for scripts
	return mf.Close()
}

// runBuiltin trains train.model.
func runBuiltin(ctx context.Context, n *node.Node, cfg config.Config, opts train.Options) (train.Result, error) {
	tr, err := train.New(n, cfg.Train, cfg.Allreduce, opts)
	if errors.Is(err, data.ErrNoText) {
		return train.Result{}, usageError{err} // a missing or empty train.data is bad configuration: exit 2
	}
	if err != nil {
		return train.Result{}, err
	}
	defer tr.Close()
	return tr.Run(ctx)
}

// runExternal waits for the local training process on the bridge's socket
// and all-reduces its gradients.
func runExternal(ctx context.Context, n *node.Node, cfg config.Config, opts train.Options, stdout io.Writer) (train.Result, error) {
	path := cfg.Train.Socket
	if path == "" {
		path = bridge.DefaultSocket(n.APIAddr())
	}
	srv, err := bridge.Listen(path, bridge.Options{Peer: n.ID().String(), Steps: uint64(cfg.Train.Steps),
		CheckEvery: cfg.Train.CheckEvery, Log: opts.Log})
	if err != nil {
		return train.Result{}, err
	}
	defer srv.Close()
	fmt.Fprintf(stdout, "waiting for the training process on %s (P2PTRAIN_SOCKET)\n", path)
	opts.Log.Info("waiting for the training process", zap.String("socket", path))
	l, err := srv.Accept(ctx)
	if err != nil {
		return train.Result{}, err
	}
	n.ServeLayout(func(from string) ([]byte, error) {
		if !isMember(n, from) {
			return nil, fmt.Errorf("%w: %s is not a member of the cluster", statesync.ErrRefused, from)
		}
		return l.Layout(), nil
	})
	defer n.ServeLayout(nil)
	tr, err := train.NewWithLearner(n, l, cfg.Train, cfg.Allreduce, opts)
	if err != nil {
		l.Finish(err, finishLinger)
		l.Close()
		return train.Result{}, err
	}
	defer tr.Close()
	res, err := tr.Run(ctx)
	err = explainLayout(ctx, n, l, err, opts.Log)
	l.Finish(err, finishLinger)
	return res, err
}

// explainLayout adds to err, when it is a settings error over the training
// process's layout, which parameters differ: it fetches the layout of a
// member that holds the cluster's (train.SettingsError.Holder). When that
// fails it logs why and returns err as it was.
func explainLayout(ctx context.Context, n *node.Node, l *bridge.Learner, err error, log *zap.Logger) error {
	var se *train.SettingsError
	if !errors.As(err, &se) || se.Holder == "" || !slices.Contains(se.Keys, bridge.LayoutKey) || se.Cluster[bridge.LayoutKey] == "" {
		return err // not a layout the cluster's PyTorch processes have
	}
	log.Info("asking a member for the cluster's layout, to name the parameters that differ", zap.String("from", se.Holder))
	ctx, cancel := context.WithTimeout(ctx, layoutFetchTimeout)
	defer cancel()
	theirs, ferr := n.FetchLayout(ctx, se.Holder)
	why := ""
	if ferr == nil {
		why, ferr = l.ExplainLayout(theirs)
	}
	switch {
	case ferr != nil:
		log.Warn("could not learn which parameters differ from the cluster's", zap.String("from", se.Holder), zap.Error(ferr))
		return err
	case why == "":
		return err // the same parameters: the summaries differ in nothing it names
	}
	return fmt.Errorf("%w; the layouts differ: %s", err, why)
}

// isMember reports whether peer is a member of n's cluster view.
func isMember(n *node.Node, peer string) bool {
	members, _ := n.View()
	return slices.ContainsFunc(members, func(m gossip.Member) bool { return m.PeerID == peer })
}

// layoutFetchTimeout bounds fetching the cluster's layout to explain a mismatch.
const layoutFetchTimeout = 10 * time.Second

// finishLinger bounds the wait for the training process to hear that the
// run is over before the daemon exits.
const finishLinger = 10 * time.Second

// announcePeer prints the peer's ID and the addresses to dial it at (scripts
// parse the lines after "dial this peer at:").
func announcePeer(stdout io.Writer, n *node.Node, cfg config.Config) {
	fmt.Fprintf(stdout, "p2ptrain %s peer %s (cluster %q)\n", version(), n.ID(), cfg.Node.Cluster)
	fmt.Fprintln(stdout, "dial this peer at:")
	for _, a := range n.AddrStrings() {
		fmt.Fprintln(stdout, " ", a)
	}
	if a := n.APIAddr(); a != "" {
		fmt.Fprintf(stdout, "local API: http://%s/status\n", a)
		fmt.Fprintf(stdout, "live page: http://%s/\n", a)
	}
}

// startPeer builds the logger, starts the node and prints its addresses. leave
// announces the departure, stops the node and flushes the log.
func startPeer(ctx context.Context, cfg config.Config, stdout, stderr io.Writer) (n *node.Node, log *zap.Logger, leave func(), err error) {
	log, err = newLogger(cfg.Log, stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	n, err = node.New(ctx, cfg, log)
	if err != nil {
		log.Sync() //nolint:errcheck // stderr sync errors are not actionable
		return nil, nil, nil, err
	}
	announcePeer(stdout, n, cfg)
	return n, log, func() {
		log.Info("leaving the cluster")
		if err := n.Close(); err != nil {
			log.Warn("shutdown", zap.Error(err))
		}
		log.Sync() //nolint:errcheck // stderr sync errors are not actionable
	}, nil
}

func version() string { return node.Version }

// trainingStatus converts the trainer's status for the node's /status.
func trainingStatus(s train.Status) node.Training {
	return node.Training{Active: s.Active, Loss: s.Loss, Accuracy: s.Accuracy, ParamHash: s.ParamHash,
		SamplesPerS: s.SamplesPerS, BytesPerStep: s.BytesPerStep, Codec: s.Codec, Waiting: s.Waiting}
}
