package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// natParams are the [node] keys of NAT traversal, parsed (docs/nat.md).
type natParams struct {
	relayClient  bool
	holePunching bool
	relayService bool
	reachability string
	announce     []ma.Multiaddr
	// relays returns relay candidates for AutoRelay (relayCandidates).
	relays autorelay.PeerSource
}

// Connection kinds of a member in /status (MemberStatus.Conn).
const (
	ConnDirect  = "direct"
	ConnRelayed = "relayed"
)

// relayBufferBytes is the relay service's copy buffer per direction of a
// relayed connection. go-libp2p's 2 KiB default costs a system call per
// 2 KiB of all-reduce traffic; 32 KiB keeps two buffers per circuit inside
// the relay service's per-peer memory limit (1 MiB) for MaxCircuits = 16.
const relayBufferBytes = 32 << 10

// relayResources are the relay service's limits (node.relay_service): no
// data or time limit on a relayed connection (go-libp2p's default of
// 128 KiB and 2 min would reset a ring stream within one step; a relay runs
// only with a swarm key, so only the cluster's members reach it), one
// reservation per member however many share a NAT's address, at most 16
// relayed connections per peer, each with two relayBufferBytes buffers:
// at most maxPeers × 16 × 64 KiB of buffers (64 MiB for 64 peers).
func relayResources(maxPeers int) relayv2.Resources {
	rc := relayv2.DefaultResources()
	rc.Limit = nil
	rc.ReservationTTL = time.Hour
	rc.MaxReservations = maxPeers
	rc.MaxReservationsPerIP = maxPeers
	rc.MaxReservationsPerASN = maxPeers
	rc.MaxCircuits = 16
	rc.BufferSize = relayBufferBytes
	return rc
}

// natOptions returns the libp2p options of NAT traversal: the relay
// transport, AutoRelay with p.relays, DCUtR, the AutoNAT service (this
// peer dials members back so they learn their reachability), the relay
// service, forced reachability and announced addresses.
func natOptions(p natParams, maxPeers int) []libp2p.Option {
	if !p.relayClient && !p.relayService {
		return []libp2p.Option{libp2p.DisableRelay(), libp2p.EnableNATService()}
	}
	opts := []libp2p.Option{libp2p.EnableRelay(), libp2p.EnableNATService()}
	if p.relayClient {
		opts = append(opts, libp2p.EnableAutoRelayWithPeerSource(p.relays,
			// One relay candidate is enough to start (the defaults wait
			// for 4 or 3 minutes); ask the source (no IO) again every 2 s,
			// as a candidate that does not relay yet is dropped, and retry
			// a relay that refused after a minute (a relay service starts
			// only once its peer knows it is reachable).
			autorelay.WithMinCandidates(1),
			autorelay.WithNumRelays(2),
			autorelay.WithBootDelay(10*time.Second),
			autorelay.WithMinInterval(2*time.Second),
			autorelay.WithBackoff(time.Minute)))
	}
	if p.holePunching {
		opts = append(opts, libp2p.EnableHolePunching())
	}
	if p.relayService {
		opts = append(opts, libp2p.EnableRelayService(relayv2.WithResources(relayResources(maxPeers))))
	}
	switch p.reachability {
	case config.ReachabilityPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case config.ReachabilityPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	if len(p.announce) > 0 {
		extra := p.announce
		opts = append(opts, libp2p.AddrsFactory(func(addrs []ma.Multiaddr) []ma.Multiaddr {
			return ma.Unique(append(slices.Clone(addrs), extra...))
		}))
	}
	return opts
}

// relayCandidates returns up to num relay candidates for AutoRelay: the
// bootstrap peers, then the alive members that gossip a public address
// other than a relayed one. AutoRelay keeps those whose identify lists the
// relay protocol, i.e. that run node.relay_service and know they are
// reachable. There is no DHT to find relays in, and with a swarm key no
// outside relay can be reached, so the cluster's own peers are the only
// candidates; the gossip view adds relays that joined after this peer.
func relayCandidates(self peer.ID, bootstrap []peer.AddrInfo, members []gossip.Member, num int) []peer.AddrInfo {
	var out []peer.AddrInfo
	seen := map[peer.ID]bool{self: true}
	add := func(info peer.AddrInfo) {
		if len(out) < num && !seen[info.ID] && len(info.Addrs) > 0 {
			seen[info.ID] = true
			out = append(out, info)
		}
	}
	for _, b := range bootstrap {
		add(b)
	}
	for _, m := range members {
		id, err := peer.Decode(m.PeerID)
		if err != nil || m.State != gossip.Alive {
			continue
		}
		info := peer.AddrInfo{ID: id}
		for _, s := range m.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil && !isRelayedAddr(a) && manet.IsPublicAddr(a) {
				info.Addrs = append(info.Addrs, a)
			}
		}
		add(info)
	}
	return out
}

// relaySource is the autorelay.PeerSource of a node: relayCandidates over
// its bootstrap peers and its gossip view, once gossip has started.
type relaySource struct {
	self      peer.ID
	bootstrap []peer.AddrInfo

	mu      sync.Mutex
	members func() []gossip.Member
}

// setMembers gives the source the gossip view (nil until gossip starts).
func (r *relaySource) setMembers(f func() []gossip.Member) {
	r.mu.Lock()
	r.members = f
	r.mu.Unlock()
}

// source is the autorelay.PeerSource.
func (r *relaySource) source(ctx context.Context, num int) <-chan peer.AddrInfo {
	r.mu.Lock()
	members := r.members
	r.mu.Unlock()
	var ms []gossip.Member
	if members != nil {
		ms = members()
	}
	cands := relayCandidates(r.self, r.bootstrap, ms, num)
	out := make(chan peer.AddrInfo, len(cands))
	for _, c := range cands {
		out <- c
	}
	close(out)
	return out
}

// isRelayedAddr reports whether a passes through a relay (/p2p-circuit).
func isRelayedAddr(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// connKind returns ConnDirect when this host has a direct connection to
// id, ConnRelayed when all its connections to id pass through a relay, and
// "" when it has none.
func connKind(h host.Host, id peer.ID) string {
	kind := ""
	for _, c := range h.Network().ConnsToPeer(id) {
		if !isRelayedAddr(c.RemoteMultiaddr()) {
			return ConnDirect
		}
		kind = ConnRelayed
	}
	return kind
}

// relayedPeers returns the peers this host reaches only through a relay.
func relayedPeers(h host.Host) map[string]bool {
	out := map[string]bool{}
	for _, id := range h.Network().Peers() {
		if connKind(h, id) == ConnRelayed {
			out[id.String()] = true
		}
	}
	return out
}

var publicNetsMu sync.Mutex

// treatAsPublic removes nets from go-multiaddr's private IPv4 ranges
// (manet.Private4), so that AutoNAT, hole punching and relay reservations,
// which only use public addresses, use addresses in nets
// (node.public_nets). It changes the whole process, once per range.
func treatAsPublic(nets []netip.Prefix) {
	publicNetsMu.Lock()
	defer publicNetsMu.Unlock()
	for _, cut := range nets {
		manet.Private4 = subtractPrefix(manet.Private4, cut)
	}
}

// subtractPrefix returns the IPv4 ranges nets without the addresses of cut
// (an IPv4 prefix): a range that holds cut is split into the ranges around
// it; other ranges are kept as they are.
func subtractPrefix(nets []*net.IPNet, cut netip.Prefix) []*net.IPNet {
	var out []*net.IPNet
	var split func(base uint32, bits int)
	split = func(base uint32, bits int) {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(base >> 24), byte(base >> 16), byte(base >> 8), byte(base)}), bits)
		switch {
		case !p.Overlaps(cut):
			out = append(out, &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(bits, 32)})
		case bits >= cut.Bits(): // inside cut
		default:
			split(base, bits+1)
			split(base|1<<(31-bits), bits+1)
		}
	}
	for _, n := range nets {
		ones, size := n.Mask.Size()
		ip4 := n.IP.To4()
		if ip4 == nil || size != 32 {
			out = append(out, n)
			continue
		}
		split(uint32(ip4[0])<<24|uint32(ip4[1])<<16|uint32(ip4[2])<<8|uint32(ip4[3]), ones)
	}
	return out
}

// natFromConfig parses the NAT keys of cfg (validated before).
func natFromConfig(cfg config.Node) (natParams, []netip.Prefix, error) {
	p := natParams{relayClient: cfg.RelayClient, holePunching: cfg.HolePunching,
		relayService: cfg.RelayService, reachability: cfg.Reachability}
	for _, s := range cfg.Announce {
		a, err := config.ParseAnnounceAddr(s)
		if err != nil {
			return natParams{}, nil, fmt.Errorf("node: node.announce: %w", err)
		}
		p.announce = append(p.announce, a)
	}
	var nets []netip.Prefix
	for _, s := range cfg.PublicNets {
		n, err := config.ParsePublicNet(s)
		if err != nil {
			return natParams{}, nil, fmt.Errorf("node: node.public_nets: %w", err)
		}
		nets = append(nets, n)
	}
	return p, nets, nil
}

// closeRedundantRelays closes the relayed connections to the peers this
// host also reaches directly (after a hole punch), so that they stop taking
// one of the relay's circuits per peer; it keeps a relayed connection that
// carries a stream of protocol keep (a ring stream of the running epoch:
// closing it would fail the step; later epochs open theirs on the direct
// connection, which libp2p prefers). It returns how many it closed.
func closeRedundantRelays(h host.Host, keep protocol.ID) int {
	closed := 0
	for _, id := range h.Network().Peers() {
		if connKind(h, id) != ConnDirect {
			continue
		}
		for _, c := range h.Network().ConnsToPeer(id) {
			if !isRelayedAddr(c.RemoteMultiaddr()) || slices.ContainsFunc(c.GetStreams(), func(s network.Stream) bool { return s.Protocol() == keep }) {
				continue
			}
			if c.Close() == nil {
				closed++
			}
		}
	}
	return closed
}

// punchGrace is how long a member may stay reached only through an
// inbound relayed connection, after this peer's hole punching is ready
// and the connection opened, before punchRetry closes it.
const punchGrace = 15 * time.Second

// punchRetry gives each member that stays relayed one more hole punch.
// go-libp2p punches when a relayed connection comes in, and only if its
// hole-punching service is running by then; that service starts once the
// host knows a public address of its own, which it polls for at up to 5 s
// intervals, so a relayed connection that arrives first is never punched
// (bench/nat.sh saw this in about 1 run in 8: the two NATed peers stayed
// relayed for the whole run). Closing such a connection once makes the
// members connect through the relay again, and the new inbound connection
// is punched; the step in flight over it fails and is retried.
type punchRetry struct {
	readyAt time.Time // when this host's hole punching was first seen running
	retried map[peer.ID]bool
}

// check closes, once per member, an inbound relayed connection to a member
// reached by no direct one, when this host's hole punching has run for
// punchGrace before now and since the connection opened, and the member
// runs hole punching too. It returns the members whose connection it
// closed.
func (p *punchRetry) check(h host.Host, now time.Time) []peer.ID {
	if p.readyAt.IsZero() {
		if !slices.Contains(h.Mux().Protocols(), holepunch.Protocol) {
			return nil
		}
		p.readyAt = now
	}
	var closed []peer.ID
	for _, id := range h.Network().Peers() {
		if p.retried[id] || connKind(h, id) != ConnRelayed {
			continue
		}
		if ps, err := h.Peerstore().SupportsProtocols(id, holepunch.Protocol); err != nil || len(ps) == 0 {
			continue
		}
		for _, c := range h.Network().ConnsToPeer(id) {
			st := c.Stat()
			since := st.Opened // or, when later, since hole punching ran
			if p.readyAt.After(since) {
				since = p.readyAt
			}
			if st.Direction != network.DirInbound || now.Sub(since) < punchGrace {
				continue
			}
			if p.retried == nil {
				p.retried = map[peer.ID]bool{}
			}
			p.retried[id] = true
			if c.Close() == nil {
				closed = append(closed, id)
			}
			break
		}
	}
	return closed
}

// logConnKinds logs, through notifications of h's network, each peer first
// reached through a relay and each direct connection to a peer that was
// reached through one (a hole punch, or a dial that found a route).
func logConnKinds(h host.Host, log *zap.Logger) {
	h.Network().Notify(&network.NotifyBundle{ConnectedF: func(nw network.Network, c network.Conn) {
		p := c.RemotePeer()
		relayed := false
		for _, o := range nw.ConnsToPeer(p) {
			relayed = relayed || (o != c && isRelayedAddr(o.RemoteMultiaddr()))
		}
		switch {
		case isRelayedAddr(c.RemoteMultiaddr()):
			log.Info("connected through a relay", zap.Stringer("peer", p), zap.Stringer("addr", c.RemoteMultiaddr()))
		case relayed:
			log.Info("direct connection to a peer reached through a relay", zap.Stringer("peer", p), zap.Stringer("addr", c.RemoteMultiaddr()))
		}
	}})
}
