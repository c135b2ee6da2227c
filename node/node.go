// Package node is the running p2ptrain peer: the libp2p host (identity,
// private network, transports, connection and resource managers), discovery
// (bootstrap, mDNS, peer exchange through gossip), membership and ring epochs
// (through package gossip) and the local HTTP API.
package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
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
	ma "github.com/multiformats/go-multiaddr"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// Version is the software version, reported in heartbeats and /status.
var Version = "0.1.0-dev"

// leaveGrace bounds how long Close waits for the departure message to go out.
const leaveGrace = 300 * time.Millisecond

// Node is one running peer. Create it with New; stop it with Close.
type Node struct {
	cfg  Config
	log  *zap.Logger
	host host.Host
	cm   *connmgr.BasicConnMgr
	bw   *metrics.BandwidthCounter
	gsp  *gossip.Service
	mdns interface{ Close() error }
	api  *apiServer
	ring *ringNet
	// probe measures links to the members (probe.go).
	probe *prober

	mu        sync.Mutex
	step      uint64
	neighbors []peer.ID
	stateSrc  StateSource
	train     trainInfo

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, starts the libp2p host, discovery, gossip and the API.
// ctx carries values only: the node runs until Close.
func New(ctx context.Context, cfg Config, log *zap.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var listen []ma.Multiaddr
	for _, s := range cfg.Node.Listen {
		a, _ := ParseListenAddr(s) // validated above
		listen = append(listen, a)
	}
	var psk pnet.PSK
	if cfg.Node.SwarmKey != "" {
		var err error
		if psk, err = LoadSwarmKey(cfg.Node.SwarmKey); err != nil {
			return nil, err
		}
	}
	if psk == nil && !slices.ContainsFunc(listen, func(a ma.Multiaddr) bool { return !isLoopback(a) }) {
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
	n := &Node{cfg: cfg, log: log, bw: metrics.NewBandwidthCounter()}
	n.host, n.cm, err = newHost(hostParams{identity: identity, psk: psk, listen: listen, maxPeers: cfg.Node.MaxPeers, bw: n.bw})
	if err != nil {
		return nil, err
	}
	n.ring = newRingNet(n.host, cfg.Allreduce.Session(nil).MaxFrame(), log.Named("allreduce"))
	n.ring.learnAddrs = n.learnAddrs
	n.probe = newProber(n.host, cfg.Probe, log.Named("probe"))
	// The node lives until Close, not until the caller's context ends: Close
	// still needs gossip to announce the departure.
	ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	n.gsp, err = gossip.New(ctx, n.host, gossip.Config{
		Cluster:  cfg.Node.Cluster,
		Interval: cfg.Gossip.Heartbeat.D(),
		Timing:   gossip.DefaultTiming(cfg.Gossip.Heartbeat.D(), cfg.Gossip.FailureTimeout.D()),
		Self:     n.selfHeartbeat,

		Planner:     newRingPlanner(cfg.Allreduce),
		ReplanEvery: cfg.Probe.ReplanInterval.D(),
	}, log.Named("gossip"))
	if err != nil {
		n.cancel()
		n.host.Close()
		return nil, err
	}
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
			n.probe.run(ctx, n.probeTargets)
		}()
	}
	for _, s := range cfg.Node.Bootstrap {
		a, _ := ParseBootstrapAddr(s) // validated above
		info, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("node: bootstrap address %s: %w", s, err)
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.bootstrap(ctx, *info)
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

// EpochTransport is the all-reduce transport of one ring epoch.
type EpochTransport interface {
	allreduce.Transport
	// Close ends the epoch gracefully (frames already sent are delivered).
	Close() error
}

// OpenTransport returns the all-reduce transport of one ring epoch over
// libp2p streams. Close it when the epoch ends normally (after closing the
// allreduce.Session); a failed session resets it.
func (n *Node) OpenTransport(ep allreduce.Epoch) EpochTransport { return n.ring.open(ep) }

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

// SetStep records the current training step (reported in heartbeats and /status).
func (n *Node) SetStep(step uint64) {
	n.mu.Lock()
	n.step = step
	n.mu.Unlock()
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
		Devices:   n.cfg.Train.Devices,
		Ready:     n.train.ready,
		WantEpoch: n.train.wantEpoch,
		Check:     n.train.check,
		Links:     n.probe.figures(),
	}
}

// watch reacts to membership: connects to newly seen members (peer exchange)
// and protects the ring neighbours in the connection manager.
func (n *Node) watch(ctx context.Context, events <-chan gossip.Event) {
	// Reconcile periodically too, in case an event was dropped or a dial failed.
	tick := time.NewTicker(n.cfg.Gossip.Heartbeat.D() * 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Epoch != nil {
				n.protectNeighbors(*ev.Epoch)
			}
			if ev.Member != nil && ev.Member.To == gossip.Alive {
				n.connectMembers(ctx)
			}
		case <-tick.C:
			n.connectMembers(ctx)
		}
	}
}

// learnAddrs adds a cluster member's gossiped addresses to the peerstore, so a
// stream can be opened to a member this peer has not connected to yet (peer
// exchange may still be under way when a ring epoch starts).
func (n *Node) learnAddrs(id peer.ID) {
	if n.host.Network().Connectedness(id) == network.Connected || len(n.host.Peerstore().Addrs(id)) > 0 {
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
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, maxBackoff)
				continue
			}
			n.log.Info("connected to bootstrap peer", zap.Stringer("peer", info.ID))
			backoff = 500 * time.Millisecond
		}
		if !sleepCtx(ctx, 5*time.Second) {
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
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
		n.ring.close()
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
		n.ring.close()
		err := n.gsp.Close()
		n.cancel()
		n.wg.Wait()
		n.closeErr = errors.Join(err, n.host.Close())
	})
	return n.closeErr
}
