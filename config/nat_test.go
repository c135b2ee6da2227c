package config

import (
	"testing"
)

// TestValidateNAT: each bad NAT key is reported with its name.
func TestValidateNAT(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(n *Node)
		want string // "" when valid
	}{
		{"defaults", func(n *Node) {}, ""},
		{"relay with key", func(n *Node) { n.RelayService, n.SwarmKey = true, "swarm.key" }, ""},
		{"lab", func(n *Node) {
			n.PublicNets, n.Announce = []string{"10.77.0.0/24", "192.168.7.0/24"}, []string{"/ip4/203.0.113.7/tcp/4001"}
		}, ""},
		{"reachability", func(n *Node) { n.Reachability = "maybe" }, `node.reachability: "maybe" is not one of`},
		{"punch without relay", func(n *Node) { n.RelayClient = false }, "node.hole_punching: needs node.relay_client"},
		{"relay without key", func(n *Node) { n.RelayService = true }, "node.relay_service: needs node.swarm_key"},
		{"private relay", func(n *Node) {
			n.RelayService, n.SwarmKey, n.Reachability = true, "k", ReachabilityPrivate
		}, "node.relay_service: a peer with node.reachability"},
		{"announce p2p", func(n *Node) {
			n.Announce = []string{"/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"}
		}, "node.announce[0]:"},
		{"announce udp", func(n *Node) { n.Announce = []string{"/ip4/203.0.113.7/udp/4001"} }, "node.announce[0]:"},
		{"public net public", func(n *Node) { n.PublicNets = []string{"8.8.8.0/24"} }, "node.public_nets[0]: \"8.8.8.0/24\" is not inside a private range"},
		{"public net v6", func(n *Node) { n.PublicNets = []string{"fc00::/8"} }, "node.public_nets[0]: \"fc00::/8\" is not an IPv4 CIDR"},
		{"public net wider", func(n *Node) { n.PublicNets = []string{"10.0.0.0/7"} }, "node.public_nets[0]:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Node.Open = true
			tc.set(&c.Node)
			wantValidate(t, c.Validate(), tc.want)
		})
	}
}
