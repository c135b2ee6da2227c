package directlink

import (
	"testing"

	ma "github.com/multiformats/go-multiaddr"
)

// TestTCPIP: only a plain IP-and-TCP address gives a direct link's IP; a
// QUIC address and a relayed (circuit) address give none.
func TestTCPIP(t *testing.T) {
	relay := "/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWJULtEwikjBUQojLiuZ1Y3goc8qCkeUUFkRNn9EjWhDEZ/p2p-circuit"
	for addr, want := range map[string]string{
		"/ip4/10.77.0.11/tcp/4001":         "10.77.0.11",
		"/ip6/::1/tcp/4001":                "::1",
		"/ip4/10.77.0.11/udp/4001/quic-v1": "",
		relay:                              "",
		relay + "/p2p/" + "12D3KooWT2TEMQtdLHQsDKkbd6NG2pTuXJMd4b9XwrSBgXurbKaS": "",
	} {
		got := TCPIP(ma.StringCast(addr))
		if (got == nil) != (want == "") || (got != nil && got.String() != want) {
			t.Errorf("TCPIP(%s) = %v, want %q", addr, got, want)
		}
	}
}
