package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// natHost starts a loopback libp2p host with NAT settings p.
func natHost(t *testing.T, p natParams) host.Host {
	t.Helper()
	return keyedNATHost(t, p, nil, "")
}

// keyedNATHost starts a loopback libp2p host with NAT settings p and swarm
// key psk (nil: none) in node.swarm_key_mode mode.
func keyedNATHost(t *testing.T, p natParams, psk pnet.PSK, mode string) host.Host {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if p.relays == nil {
		p.relays = (&relaySource{}).source
	}
	h, _, err := newHost(hostParams{identity: key, psk: psk, pskMode: mode, listen: []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/0")},
		maxPeers: 8, bw: metrics.NewBandwidthCounter(), nat: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestRelayCarriesTrainingTraffic: a peer reached only through a relay
// that runs relayResources has a relayed, unlimited connection (streams
// open on it without network.WithAllowLimitedConn) that carries far more
// than go-libp2p's default 128 KiB relay limit; connKind tells it from a
// direct one. So without a swarm key and with one in either mode.
func TestRelayCarriesTrainingTraffic(t *testing.T) {
	key := make(pnet.PSK, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"no key", config.SwarmKeyNoise, config.SwarmKeyPnet} {
		t.Run(mode, func(t *testing.T) {
			if mode == "no key" {
				relayCarriesTrainingTraffic(t, nil, "")
			} else {
				relayCarriesTrainingTraffic(t, key, mode)
			}
		})
	}
}

func relayCarriesTrainingTraffic(t *testing.T, psk pnet.PSK, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b, _, rsvp := relayedPair(t, ctx, psk, mode)
	if rsvp.LimitData != 0 || rsvp.LimitDuration != 0 {
		t.Fatalf("relay limits %d bytes, %s; want none", rsvp.LimitData, rsvp.LimitDuration)
	}
	if k := connKind(b, a.ID()); k != ConnRelayed {
		t.Fatalf("connection through the relay is %q, want %q", k, ConnRelayed)
	}
	if rp := relayedPeers(b); !rp[a.ID().String()] || len(rp) != 1 {
		t.Fatalf("relayedPeers = %v, want only %s", relayedPeers(b), a.ID())
	}

	const proto = protocol.ID("/p2ptrain/test/relay-bulk")
	const size = 4 << 20 // 32 times go-libp2p's default relay data limit
	got := make(chan int64, 1)
	a.SetStreamHandler(proto, func(s network.Stream) {
		n, _ := io.Copy(io.Discard, s)
		s.Close()
		got <- n
	})
	s, err := b.NewStream(ctx, a.ID(), proto)
	if err != nil {
		t.Fatalf("open a stream over the relayed connection: %v", err)
	}
	if !isRelayedAddr(s.Conn().RemoteMultiaddr()) || s.Conn().Stat().Limited {
		t.Fatalf("stream on %s (limited %v), want an unlimited relayed connection", s.Conn().RemoteMultiaddr(), s.Conn().Stat().Limited)
	}
	if _, err := s.Write(make([]byte, size)); err != nil {
		t.Fatalf("write %d bytes through the relay: %v", size, err)
	}
	s.CloseWrite()
	select {
	case n := <-got:
		if n != size {
			t.Fatalf("received %d bytes through the relay, want %d", n, size)
		}
	case <-ctx.Done():
		t.Fatal("bulk transfer through the relay did not finish")
	}

	// A stream of the kept protocol holds the relayed connection open.
	const keep = protocol.ID("/p2ptrain/test/keep")
	a.SetStreamHandler(keep, func(s network.Stream) { io.Copy(io.Discard, s); s.Close() })
	held, err := b.NewStream(ctx, a.ID(), keep)
	if err != nil {
		t.Fatal(err)
	}

	// Connect returns at once while a connection (relayed or not) exists.
	direct := network.WithForceDirectDial(ctx, "test: direct after relayed")
	if err := b.Connect(direct, peer.AddrInfo{ID: a.ID(), Addrs: a.Addrs()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "direct connection", func() error {
		if k := connKind(b, a.ID()); k != ConnDirect {
			return fmt.Errorf("connection kind %q", k)
		}
		return nil
	})
	if c := closeRedundantRelays(b, keep); c != 0 {
		t.Fatalf("closed %d relayed connections while one carries a kept stream", c)
	}
	held.Reset()
	eventually(t, 5*time.Second, "relayed connection closed", func() error {
		closeRedundantRelays(b, keep)
		if conns := b.Network().ConnsToPeer(a.ID()); len(conns) != 1 || isRelayedAddr(conns[0].RemoteMultiaddr()) {
			return fmt.Errorf("connections to a: %v", conns)
		}
		return nil
	})
	if k := connKind(b, peer.ID("nobody")); k != "" {
		t.Fatalf("connKind of an unknown peer = %q, want none", k)
	}
}

// relayedPair returns two hosts behind a relay (swarm key psk, nil for
// none, in mode), b connected to a only through the relay (the connection
// is inbound at a), the circuit address of a and a's reservation.
func relayedPair(t *testing.T, ctx context.Context, psk pnet.PSK, mode string) (a, b host.Host, circuit ma.Multiaddr, rsvp *client.Reservation) {
	t.Helper()
	relay := keyedNATHost(t, natParams{relayService: true, reachability: config.ReachabilityPublic}, psk, mode)
	behind := natParams{relayClient: true, reachability: config.ReachabilityPrivate}
	a, b = keyedNATHost(t, behind, psk, mode), keyedNATHost(t, behind, psk, mode)
	eventually(t, 10*time.Second, "relay service started", func() error {
		if !slices.Contains(relay.Mux().Protocols(), circuitproto.ProtoIDv2Hop) {
			return fmt.Errorf("relay protocols %v", relay.Mux().Protocols())
		}
		return nil
	})
	relayInfo := peer.AddrInfo{ID: relay.ID(), Addrs: relay.Addrs()}
	if err := a.Connect(ctx, relayInfo); err != nil {
		t.Fatal(err)
	}
	rsvp, err := client.Reserve(ctx, a, relayInfo)
	if err != nil {
		t.Fatalf("reserve a slot on the relay: %v", err)
	}
	circuit = relay.Addrs()[0].Encapsulate(ma.StringCast("/p2p/" + relay.ID().String() + "/p2p-circuit"))
	if err := b.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: []ma.Multiaddr{circuit}}); err != nil {
		t.Fatalf("connect through the relay: %v", err)
	}
	return a, b, circuit, rsvp
}

// TestPunchRetryClosesARelayedConnectionOnce: a member reached only
// through a relayed connection that came in (this end is the one that
// punches) has it closed once punchGrace has passed since this host's hole
// punching started and since the connection opened, provided the member
// runs hole punching too; never before, never at the end that dialed
// through the relay, and never twice for one member.
func TestPunchRetryClosesARelayedConnectionOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b, circuit, _ := relayedPair(t, ctx, nil, "")
	var pa, pb punchRetry
	t0 := time.Now()
	if got := pa.check(a, t0.Add(time.Hour)); got != nil {
		t.Fatalf("closed %v before hole punching ran", got)
	}
	// Stand-ins for go-libp2p's hole-punching service, which registers
	// its protocol once it runs.
	for _, h := range []host.Host{a, b} {
		h.SetStreamHandler(holepunch.Protocol, func(s network.Stream) { s.Reset() })
	}
	eventually(t, 10*time.Second, "each end knows the other punches", func() error {
		for _, x := range [][2]host.Host{{a, b}, {b, a}} {
			if ps, _ := x[0].Peerstore().SupportsProtocols(x[1].ID(), holepunch.Protocol); len(ps) == 0 {
				return fmt.Errorf("%s does not list %s's hole punching", x[0].ID(), x[1].ID())
			}
		}
		return nil
	})
	now := time.Now()
	if got := pa.check(a, now); got != nil || pa.readyAt != now {
		t.Fatalf("closed %v (ready at %v) the moment hole punching ran", got, pa.readyAt)
	}
	if got := pa.check(a, now.Add(punchGrace-time.Second)); got != nil {
		t.Fatalf("closed %v within punchGrace", got)
	}
	pb.check(b, now)
	if got := pb.check(b, now.Add(time.Hour)); got != nil {
		t.Fatalf("the end that dialed through the relay closed %v", got)
	}
	if got := pa.check(a, now.Add(time.Hour)); len(got) != 1 || got[0] != b.ID() {
		t.Fatalf("closed %v, want the relayed member %s only", got, b.ID())
	}
	eventually(t, 10*time.Second, "relayed connection closed at both ends", func() error {
		if k, l := connKind(a, b.ID()), connKind(b, a.ID()); k != "" || l != "" {
			return fmt.Errorf("a reaches b %q, b reaches a %q", k, l)
		}
		return nil
	})
	// Relayed again (through the relay only: loopback's direct address
	// would do): not closed a second time.
	b.Peerstore().ClearAddrs(a.ID())
	if err := b.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: []ma.Multiaddr{circuit}}); err != nil {
		t.Fatalf("connect through the relay again: %v", err)
	}
	eventually(t, 10*time.Second, "relayed connection back at a", func() error {
		if k := connKind(a, b.ID()); k != ConnRelayed {
			return fmt.Errorf("a reaches b %q", k)
		}
		return nil
	})
	if got := pa.check(a, now.Add(2*time.Hour)); got != nil {
		t.Fatalf("closed %v a second time", got)
	}
	if k := connKind(a, b.ID()); k != ConnRelayed {
		t.Fatalf("a reaches b %q after the second check, want %q", k, ConnRelayed)
	}
}

// TestRelayCandidates: bootstrap peers first, then alive members with a
// public direct address; never self, dead members or relayed addresses.
func TestRelayCandidates(t *testing.T) {
	ids := make([]peer.ID, 5)
	for i := range ids {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		ids[i], _ = peer.IDFromPrivateKey(key)
	}
	boot := []peer.AddrInfo{{ID: ids[1], Addrs: []ma.Multiaddr{ma.StringCast("/ip4/10.0.0.1/tcp/4001")}}}
	member := func(id peer.ID, state gossip.State, addrs ...string) gossip.Member {
		m := gossip.Member{Heartbeat: gossip.Heartbeat{PeerID: id.String(), Addrs: addrs}, State: state}
		return m
	}
	members := []gossip.Member{
		member(ids[0], gossip.Alive, "/ip4/198.51.99.1/tcp/4001"),                                        // self
		member(ids[1], gossip.Alive, "/ip4/198.51.99.2/tcp/4001"),                                        // bootstrap, listed already
		member(ids[2], gossip.Alive, "/ip4/192.168.1.2/tcp/4001", "/ip4/203.1.1.1/tcp/4001/p2p-circuit"), // private or relayed only
		member(ids[3], gossip.Dead, "/ip4/8.8.8.8/tcp/4001"),
		member(ids[4], gossip.Alive, "/ip4/192.168.1.3/tcp/4001", "/ip4/8.8.4.4/tcp/4001"),
	}
	got := relayCandidates(ids[0], boot, members, 10)
	if len(got) != 2 || got[0].ID != ids[1] || got[1].ID != ids[4] || len(got[1].Addrs) != 1 || got[1].Addrs[0].String() != "/ip4/8.8.4.4/tcp/4001" {
		t.Fatalf("candidates %v, want the bootstrap peer and %s at 8.8.4.4", got, ids[4])
	}
	if got := relayCandidates(ids[0], boot, members, 1); len(got) != 1 || got[0].ID != ids[1] {
		t.Fatalf("one candidate: %v, want the bootstrap peer", got)
	}
}

// TestSubtractPrefix: a range that holds the cut is split around it.
func TestSubtractPrefix(t *testing.T) {
	_, ten, _ := net.ParseCIDR("10.0.0.0/8")
	_, other, _ := net.ParseCIDR("192.168.0.0/16")
	out := subtractPrefix([]*net.IPNet{ten, other}, netip.MustParsePrefix("10.77.0.0/24"))
	if len(out) != 1+16 {
		t.Fatalf("%d ranges, want 17: %v", len(out), out)
	}
	for _, s := range []string{"10.0.0.1", "10.76.255.255", "10.77.1.0", "10.255.0.1", "192.168.3.4"} {
		if !slices.ContainsFunc(out, func(n *net.IPNet) bool { return n.Contains(net.ParseIP(s)) }) {
			t.Errorf("%s is no longer in a range", s)
		}
	}
	for _, s := range []string{"10.77.0.0", "10.77.0.200", "10.77.0.255"} {
		if slices.ContainsFunc(out, func(n *net.IPNet) bool { return n.Contains(net.ParseIP(s)) }) {
			t.Errorf("%s is still in a range", s)
		}
	}
}

// TestStatusConnDirect: /status marks a member reached over TCP as direct
// and leaves self without a connection kind.
func TestStatusConnDirect(t *testing.T) {
	a := startNode(t, testConfig(), nil)
	b := startNode(t, testConfig(a.AddrStrings()[0]), nil)
	eventually(t, 15*time.Second, "b sees a as a direct member", func() error {
		for _, m := range b.Status().Members {
			switch {
			case m.PeerID == b.ID().String() && m.Conn != "":
				return fmt.Errorf("self has connection kind %q", m.Conn)
			case m.PeerID == a.ID().String() && m.Conn == ConnDirect:
				return nil
			case m.PeerID == a.ID().String():
				return fmt.Errorf("a's connection kind %q", m.Conn)
			}
		}
		return fmt.Errorf("a is not a member: %+v", b.Status().Members)
	})
}
