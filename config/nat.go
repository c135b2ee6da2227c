package config

import (
	"fmt"
	"net/netip"

	ma "github.com/multiformats/go-multiaddr"
)

// Values of node.reachability.
const (
	// ReachabilityAuto lets AutoNAT find out whether the peer accepts
	// inbound connections (other members dial it back).
	ReachabilityAuto = "auto"
	// ReachabilityPublic declares the peer reachable: it never looks for
	// a relay and, with node.relay_service, relays at once.
	ReachabilityPublic = "public"
	// ReachabilityPrivate declares the peer unreachable: it reserves a
	// relay slot at once instead of waiting for AutoNAT.
	ReachabilityPrivate = "private"
)

// privateNets4 are the IPv4 ranges go-multiaddr treats as private, other
// than loopback and link-local: node.public_nets must lie inside one.
var privateNets4 = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

// ParsePublicNet parses one node.public_nets entry: an IPv4 CIDR inside a
// private range (10/8, 100.64/10, 172.16/12, 192.168/16), masked.
func ParsePublicNet(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 CIDR such as 10.77.0.0/24", s)
	}
	p = p.Masked()
	for _, priv := range privateNets4 {
		if priv.Bits() <= p.Bits() && priv.Contains(p.Addr()) {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%q is not inside a private range (10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12, 192.168.0.0/16); public addresses need no entry", s)
}

// ParseAnnounceAddr parses one node.announce entry: a TCP multiaddr of an
// IP or DNS name, without /p2p (the peer adds its own ID).
func ParseAnnounceAddr(s string) (ma.Multiaddr, error) {
	if a, err := ma.NewMultiaddr(s); err == nil {
		if _, err := a.ValueForProtocol(ma.P_P2P); err == nil {
			return nil, fmt.Errorf("%q ends in /p2p/...: announce the address only, the peer adds its ID", s)
		}
	}
	return ParseListenAddr(s)
}

// validateNAT checks the NAT traversal keys of [node].
func (n *Node) validateNAT(bad func(key, format string, args ...any)) {
	switch n.Reachability {
	case ReachabilityAuto, ReachabilityPublic, ReachabilityPrivate:
	default:
		bad("node.reachability", "%q is not one of %s, %s, %s", n.Reachability, ReachabilityAuto, ReachabilityPublic, ReachabilityPrivate)
	}
	if n.HolePunching && !n.RelayClient {
		bad("node.hole_punching", "needs node.relay_client: hole punching upgrades relayed connections")
	}
	if n.RelayService && n.SwarmKey == "" {
		bad("node.relay_service", "needs node.swarm_key: the relay puts no data or time limit on relayed connections, "+
			"so without a key it would carry anyone's traffic")
	}
	if n.RelayService && n.Reachability == ReachabilityPrivate {
		bad("node.relay_service", "a peer with node.reachability = %q cannot relay: members could not reach it", ReachabilityPrivate)
	}
	for i, s := range n.Announce {
		if _, err := ParseAnnounceAddr(s); err != nil {
			bad(fmt.Sprintf("node.announce[%d]", i), "%v", err)
		}
	}
	for i, s := range n.PublicNets {
		if _, err := ParsePublicNet(s); err != nil {
			bad(fmt.Sprintf("node.public_nets[%d]", i), "%v", err)
		}
	}
}
