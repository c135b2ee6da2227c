// Package node is the running p2ptrain peer: the libp2p host (identity,
// private network, transports, connection and resource managers), discovery
// (bootstrap, mDNS, peer exchange through gossip), membership and ring epochs
// (through package gossip), the local HTTP API, and the stream protocols it
// wires onto the host (protocol/ringstream, protocol/statesync,
// protocol/probe). A trainer (package train) uses it through train.Cluster.
package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/internal/ctxutil"
	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/pipestream"
	"github.com/p2ptrain/p2ptrain/protocol/probe"
	"github.com/p2ptrain/p2ptrain/protocol/ringstream"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// Version is the software version, reported in heartbeats and /status.
var Version = "0.1.0-dev"

// leaveGrace bounds how long Close waits for the departure message to go out.
const leaveGrace = 300 * time.Millisecond

// Node is one running peer. Create it with New; stop it with Close.
type Node struct {
	cfg   config.Config
	psk   pnet.PSK // the swarm key (nil: none)
	log   *zap.Logger
	host  host.Host
	cm    *connmgr.BasicConnMgr
	bw    *metrics.BandwidthCounter
	gsp   *gossip.Service
	mdns  interface{ Close() error }
	api   *apiServer
	ring  *ringstream.Service
	pipe  *pipestream.Service
	state *statesync.Server
	probe *probe.Prober
	// relays feeds AutoRelay its candidates (node.relay_client).
	relays *relaySource
	// stages is the pipeline stages the cluster trains with, which the
	// ring planner lays pipelines out for (below 2: none).
	stages atomic.Int32

	mu        sync.Mutex
	step      uint64
	neighbors []peer.ID
	// app and wantEpoch are what the trainer announces (train.Cluster).
	app       []byte
	wantEpoch uint64
	// computeUS is the compute per sample the trainer measured (SetCompute).
	computeUS float64
	training  Training
	// history keeps the run's timeline for /history; sinks get it too.
	history *telemetry.History
	sinks   telemetry.Tee

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, starts the libp2p host, discovery, gossip and the API.
// ctx carries values only: the node runs until Close.
func New(ctx context.Context, cfg config.Config, log *zap.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var listen []ma.Multiaddr
	for _, s := range cfg.Node.Listen {
		a, _ := config.ParseListenAddr(s) // validated above
		listen = append(listen, a)
	}
	var psk pnet.PSK
	if cfg.Node.SwarmKey != "" {
		var err error
		if psk, err = LoadSwarmKey(cfg.Node.SwarmKey); err != nil {
			return nil, err
		}
	}
	if psk == nil && !slices.ContainsFunc(listen, func(a ma.Multiaddr) bool { return !config.IsLoopback(a) }) {
		log.Info("no swarm key: loopback-only peer")
	} else if psk == nil {
		log.Warn("no swarm key: this is an open cluster; anyone who can reach the listen addresses can join")
	}
	identity, err := loadOrGenerateIdentity(cfg.Node.Identity, log)
	if err != nil {
		return nil, err
	}
	if cfg.Node.Name == "" {
		cfg.Node.Name, _ = os.Hostname()
	}
	nat, publicNets, err := natFromConfig(cfg.Node)
	if err != nil {
		return nil, err
	}
	treatAsPublic(publicNets)
	self, err := peer.IDFromPrivateKey(identity)
	if err != nil {
		return nil, fmt.Errorf("node: peer ID of the identity: %w", err)
	}
	boot, err := bootstrapPeers(cfg.Node.Bootstrap, self, log)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, psk: psk, log: log, bw: metrics.NewBandwidthCounter(), history: telemetry.NewHistory(historyRecords),
		relays: &relaySource{self: self, bootstrap: boot}}
	if st := cfg.Train.PipelineStages; !st.Auto() {
		n.stages.Store(int32(st))
	}
	nat.relays = n.relays.source
	n.host, n.cm, err = newHost(hostParams{identity: identity, psk: psk, pskMode: cfg.Node.SwarmKeyMode, log: log.Named("security"), listen: listen, maxPeers: cfg.Node.MaxPeers, bw: n.bw, nat: nat})
	if err != nil {
		return nil, err
	}
	logConnKinds(n.host, log)
	n.ring = ringstream.New(n.host, cfg.Allreduce.Session(nil).MaxFrame(), n.learnAddrs, log.Named("allreduce"))
	n.ring.SetDirect(cfg.Allreduce.DirectLinks)
	n.pipe = pipestream.New(n.host, n.learnAddrs, log.Named("pipeline"))
	n.pipe.SetDirect(cfg.Allreduce.DirectLinks)
	n.state = statesync.NewServer(n.host, log.Named("state"))
	n.probe = probe.New(n.host, cfg.Probe.Prober(), log.Named("probe"))
	// The node lives until Close, not until the caller's context ends: Close
	// still needs gossip to announce the departure.
	ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	timing := gossip.DefaultTiming(cfg.Gossip.Heartbeat.D(), cfg.Gossip.FailureTimeout.D())
	timing.ExcludeFor = cfg.Gossip.ExcludeFor.D()
	n.gsp, err = gossip.New(ctx, n.host, gossip.Config{
		Cluster:  cfg.Node.Cluster,
		Interval: cfg.Gossip.Heartbeat.D(),
		Timing:   timing,
		Self:     n.selfHeartbeat,

		Planner:     plan.NewPlanner(cfg.Allreduce.Planner()).WithStages(func() int { return int(n.stages.Load()) }),
		ReplanEvery: cfg.Probe.ReplanInterval.D(),
	}, log.Named("gossip"))
	if err != nil {
		n.cancel()
		n.host.Close()
		return nil, err
	}
	n.relays.setMembers(func() []gossip.Member { members, _ := n.gsp.Snapshot(); return members })
	if cfg.Node.API != "" {
		if n.api, err = startAPI(cfg.Node.API, n, log.Named("api")); err != nil {
			n.cancel()
			n.gsp.Close()
			n.host.Close()
			return nil, err
		}
	}
	events, unsubscribe := n.gsp.Subscribe()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer unsubscribe()
		n.watch(ctx, events)
	}()
	if cfg.Probe.Enabled {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.probe.Run(ctx, n.probeTargets)
		}()
	}
	for _, info := range boot {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.bootstrap(ctx, info)
		}()
	}
	if cfg.Node.MDNS {
		svc := mdns.NewMdnsService(n.host, "p2ptrain-"+cfg.Node.Cluster, mdnsNotifee{n: n, ctx: ctx})
		if err := svc.Start(); err != nil {
			log.Warn("mDNS discovery unavailable", zap.Error(err))
		} else {
			n.mdns = svc
		}
	}
	log.Info("peer started", zap.Stringer("peer_id", n.host.ID()), zap.Strings("addrs", n.AddrStrings()))
	return n, nil
}

func loadOrGenerateIdentity(path string, log *zap.Logger) (crypto.PrivKey, error) {
	if path != "" {
		return LoadIdentity(path)
	}
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("node: generate identity: %w", err)
	}
	log.Info("using a fresh identity for this run (set node.identity to keep one)")
	return priv, nil
}

// OpenTransport returns the all-reduce transport of one ring epoch over
// libp2p streams. Close it when the epoch ends normally (after closing the
// allreduce.Session); a failed session resets it.
func (n *Node) OpenTransport(ep allreduce.Ring) allreduce.EpochTransport { return n.ring.Open(ep) }

// ID returns the peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Host returns the libp2p host.
func (n *Node) Host() host.Host { return n.host }

// Gossip returns the membership service.
func (n *Node) Gossip() *gossip.Service { return n.gsp }

// Addrs returns the peer's dialable multiaddrs, each ending in /p2p/<id>.
func (n *Node) Addrs() []ma.Multiaddr {
	info := peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()}
	out, err := peer.AddrInfoToP2pAddrs(&info)
	if err != nil {
		return nil
	}
	return out
}

// AddrStrings returns Addrs as strings.
func (n *Node) AddrStrings() []string {
	var out []string
	for _, a := range n.Addrs() {
		out = append(out, a.String())
	}
	return out
}

// APIAddr returns the address the HTTP API listens on ("" when off).
func (n *Node) APIAddr() string {
	if n.api == nil {
		return ""
	}
	return n.api.addr()
}

func (n *Node) selfHeartbeat() gossip.Heartbeat {
	n.mu.Lock()
	defer n.mu.Unlock()
	var addrs []string
	for _, a := range n.host.Addrs() {
		addrs = append(addrs, a.String())
	}
	return gossip.Heartbeat{
		Name:      n.cfg.Node.Name,
		Addrs:     addrs,
		Version:   Version,
		Step:      n.step,
		App:       n.app,
		WantEpoch: n.wantEpoch,
		Observer:  n.cfg.Node.Observer || (n.cfg.Node.AwaitApp && n.app == nil),
		Links:     plan.MarkRelayed(n.probe.Figures(), relayedPeers(n.host)),
		ComputeUS: n.computeUS,
	}
}

// watch reacts to membership: connects to newly seen members (peer exchange)
// and protects the ring neighbours in the connection manager.
func (n *Node) watch(ctx context.Context, events <-chan gossip.Event) {
	// Reconcile periodically too, in case an event was dropped or a dial failed.
	tick := time.NewTicker(n.cfg.Gossip.Heartbeat.D() * 2)
	defer tick.Stop()
	var punch punchRetry
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			n.recordEvent(ev)
			if ev.Epoch != nil {
				n.protectNeighbors(*ev.Epoch)
			}
			if ev.Member != nil && ev.Member.To == gossip.Alive {
				n.connectMembers(ctx)
			}
		case <-tick.C:
			n.connectMembers(ctx)
			if c := closeRedundantRelays(n.host, ringstream.ID); c > 0 {
				n.log.Debug("closed relayed connections to peers reached directly", zap.Int("closed", c))
			}
			if n.cfg.Node.HolePunching {
				for _, id := range punch.check(n.host, time.Now()) {
					n.log.Info("closed a relayed connection to punch a hole again", zap.Stringer("peer", id))
				}
			}
		}
	}
}

// learnAddrs prepares a dial to a cluster member (before a ring stream or a
// state fetch): it clears libp2p's dial back-off for it (clearDialBackoff)
// and adds its gossiped addresses to the peerstore, so a stream can be
// opened to a member this peer has not connected to yet (peer exchange may
// still be under way when a ring epoch starts).
func (n *Node) learnAddrs(id peer.ID) {
	if n.host.Network().Connectedness(id) == network.Connected {
		return
	}
	clearDialBackoff(n.host, id)
	if len(n.host.Peerstore().Addrs(id)) > 0 {
		return
	}
	members, _ := n.gsp.Snapshot()
	for _, m := range members {
		if m.PeerID != id.String() {
			continue
		}
		var addrs []ma.Multiaddr
		for _, s := range m.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil {
				addrs = append(addrs, a)
			}
		}
		n.host.Peerstore().AddAddrs(id, addrs, peerstore.TempAddrTTL)
		return
	}
}

// clearDialBackoff ends libp2p's dial back-off for id. A dial that failed
// once (a lost SYN under packet loss, a peer not listening yet) puts the
// peer's addresses in a back-off of 5 s growing to 5 minutes, during which
// every dial fails at once with "dial backoff"; a member the gossip hears
// and the ring needs is worth a fresh dial. (With 1 % packet loss a peer
// could not open its ring stream to a neighbour, its steps failed, and the
// others excluded it.)
func clearDialBackoff(h host.Host, id peer.ID) {
	if sw, ok := h.Network().(*swarm.Swarm); ok {
		sw.Backoff().Clear(id)
	}
}

// connectMembers dials every live member we are not connected to, up to MaxPeers.
func (n *Node) connectMembers(ctx context.Context) {
	members, _ := n.gsp.Snapshot()
	connected := 0
	for _, m := range members {
		if n.host.Network().Connectedness(peer.ID(m.PeerID)) == network.Connected {
			connected++
		}
	}
	for _, m := range members {
		id, err := peer.Decode(m.PeerID)
		if err != nil || id == n.host.ID() || m.State != gossip.Alive {
			continue
		}
		if n.host.Network().Connectedness(id) == network.Connected {
			continue
		}
		if connected >= n.cfg.Node.MaxPeers {
			return
		}
		info := peer.AddrInfo{ID: id}
		for _, s := range m.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil {
				info.Addrs = append(info.Addrs, a)
			}
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = n.host.Connect(dctx, info)
		cancel()
		if err != nil {
			n.log.Debug("peer exchange: dial failed", zap.Stringer("peer", id), zap.Error(err))
			continue
		}
		connected++
		n.log.Debug("peer exchange: connected", zap.Stringer("peer", id))
	}
}

func (n *Node) protectNeighbors(e gossip.Epoch) {
	self := n.host.ID().String()
	var next []peer.ID
	if i := slices.Index(e.Order, self); i >= 0 && len(e.Order) > 1 {
		for _, j := range []int{(i + 1) % len(e.Order), (i + len(e.Order) - 1) % len(e.Order)} {
			if id, err := peer.Decode(e.Order[j]); err == nil {
				next = append(next, id)
			}
		}
	}
	n.mu.Lock()
	old := n.neighbors
	n.neighbors = next
	n.mu.Unlock()
	for _, p := range old {
		n.cm.Unprotect(p, "ring")
	}
	for _, p := range next {
		n.cm.Protect(p, "ring")
	}
}

// bootstrapPeers reads node.bootstrap. An entry naming this peer itself
// is left out (one config file for every machine lists the first one's
// address on the first one too), and one without a transport address
// (only /p2p/ID) is refused: there is nothing to dial.
func bootstrapPeers(addrs []string, self peer.ID, log *zap.Logger) ([]peer.AddrInfo, error) {
	var boot []peer.AddrInfo
	for _, s := range addrs {
		a, _ := config.ParseBootstrapAddr(s) // validated above
		info, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil {
			return nil, fmt.Errorf("node: bootstrap address %s: %w", s, err)
		}
		if len(info.Addrs) == 0 {
			return nil, fmt.Errorf("node: bootstrap address %s has only a peer ID: want its address too, /ip4/HOST/tcp/PORT/p2p/ID", s)
		}
		if info.ID == self {
			log.Info("a bootstrap address is this peer's own; left out", zap.String("addr", s))
			continue
		}
		boot = append(boot, *info)
	}
	return boot, nil
}

// bootstrap connects to one bootstrap peer, retrying with backoff, and
// reconnects whenever the connection is lost while the peer is not otherwise known.
func (n *Node) bootstrap(ctx context.Context, info peer.AddrInfo) {
	backoff := 500 * time.Millisecond
	const maxBackoff = 30 * time.Second
	for {
		if n.host.Network().Connectedness(info.ID) != network.Connected {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := n.host.Connect(dctx, info)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				n.log.Warn("bootstrap peer unreachable; retrying", zap.Stringer("peer", info.ID),
					zap.Duration("retry_in", backoff), zap.Error(err))
				if !ctxutil.Sleep(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, maxBackoff)
				continue
			}
			n.log.Info("connected to bootstrap peer", zap.Stringer("peer", info.ID))
			backoff = 500 * time.Millisecond
		}
		if !ctxutil.Sleep(ctx, 5*time.Second) {
			return
		}
	}
}

type mdnsNotifee struct {
	n   *Node
	ctx context.Context
}

func (m mdnsNotifee) HandlePeerFound(info peer.AddrInfo) {
	if info.ID == m.n.host.ID() {
		return
	}
	m.n.wg.Add(1)
	go func() {
		defer m.n.wg.Done()
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		defer cancel()
		if err := m.n.host.Connect(ctx, info); err != nil {
			m.n.log.Debug("mDNS peer unreachable", zap.Stringer("peer", info.ID), zap.Error(err))
		}
	}()
}

// Close announces the departure, then stops everything. It is idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), leaveGrace)
		defer cancel()
		var errs []error
		if err := n.gsp.Leave(ctx); err != nil {
			n.log.Warn("could not announce departure", zap.Error(err))
		} else {
			// Give the departure a moment to leave the send queues before the host closes.
			<-ctx.Done()
		}
		if n.api != nil {
			errs = append(errs, n.api.close())
		}
		if n.mdns != nil {
			errs = append(errs, n.mdns.Close())
		}
		n.ring.Close()
		n.pipe.Close()
		errs = append(errs, n.gsp.Close())
		n.cancel()
		n.wg.Wait()
		errs = append(errs, n.host.Close())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// Kill stops the node without announcing its departure (tests simulate a crash).
func (n *Node) Kill() error {
	n.closeOnce.Do(func() {
		if n.api != nil {
			n.api.close()
		}
		if n.mdns != nil {
			n.mdns.Close()
		}
		n.ring.Close()
		n.pipe.Close()
		err := n.gsp.Close()
		n.cancel()
		n.wg.Wait()
		n.closeErr = errors.Join(err, n.host.Close())
	})
	return n.closeErr
}
