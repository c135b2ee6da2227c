package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/protocol/probe"
	"github.com/p2ptrain/p2ptrain/protocol/ringstream"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
)

// hostParams is what building a libp2p host needs beyond the config.
type hostParams struct {
	identity crypto.PrivKey
	psk      pnet.PSK
	// pskMode is node.swarm_key_mode: how psk keeps others out.
	pskMode  string
	log      *zap.Logger
	listen   []ma.Multiaddr
	maxPeers int
	bw       *metrics.BandwidthCounter
	nat      natParams
}

// resourceLimits returns libp2p's auto-scaled defaults with explicit limits for
// p2ptrain's protocols: a few long-lived streams per ring neighbour, bounded memory.
func resourceLimits(maxPeers int) rcmgr.ConcreteLimitConfig {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	per := func(streams int, memory int64) (rcmgr.BaseLimit, rcmgr.BaseLimitIncrease) {
		return rcmgr.BaseLimit{
				StreamsInbound:  streams * maxPeers,
				StreamsOutbound: streams * maxPeers,
				Streams:         2 * streams * maxPeers,
				Memory:          memory,
			}, rcmgr.BaseLimitIncrease{
				Memory: memory / 4,
			}
	}
	peerLimit := func(streams int, memory int64) rcmgr.BaseLimit {
		return rcmgr.BaseLimit{StreamsInbound: streams, StreamsOutbound: streams, Streams: 2 * streams, Memory: memory}
	}
	for _, p := range []struct {
		id       protocol.ID
		streams  int
		memory   int64
		perPeer  int
		peerMemo int64
	}{
		{ringstream.ID, 8, 1 << 30, 8, 256 << 20},
		{statesync.ID, 2, 256 << 20, 2, 128 << 20},
		{probe.ID, 2, 64 << 20, 2, 32 << 20},
	} {
		base, inc := per(p.streams, p.memory)
		limits.AddProtocolLimit(p.id, base, inc)
		limits.AddProtocolPeerLimit(p.id, peerLimit(p.perPeer, p.peerMemo), rcmgr.BaseLimitIncrease{})
	}
	return limits.AutoScale()
}

// streamWindow is the yamux receive window every stream starts with (the
// protocol's initial 256 KiB, then one window update). yamux only grows a
// window that is used up within 4 round trips of its idle-link RTT, which a
// queue in front of a busy link never allows: a ring neighbour's stream
// then stalls on window updates queued behind bulk data. On 4 shaped
// network-namespace hosts (fp32, 64 MiB) 256 KiB / 1 MiB / 4 MiB gave: ring
// at 250 Mbit/s 0.81 / 0.93 / 0.93 of the link rate; ring with one host at
// 100 Mbit/s 10.0 / 8.2 / 8.2 s; proportional shares there 6.6 / 6.4 /
// 6.9 s (more in flight from every peer at once into the slow one).
const streamWindow = 1 << 20

// muxerMessage is the largest yamux message (its 12-byte header
// included): one Noise record's plaintext. yamux's default, 64 KiB, is 17
// bytes more, so every full message became a 64 KiB record and a 17-byte
// one: twice the records, encryptions and write system calls (a daemon of
// a 4-host fp32 ring, 7 all-reduces of 64 MiB: 21.4k writes, 12.5k with
// this size).
const muxerMessage = noise.MaxPlaintextLength

// muxer returns go-libp2p's yamux transport with streamWindow and
// messages of muxerMessage bytes.
func muxer() *yamux.Transport {
	cfg := *yamux.DefaultTransport
	cfg.InitialStreamWindowSize = streamWindow
	cfg.MaxStreamWindowSize = max(cfg.MaxStreamWindowSize, streamWindow)
	cfg.MaxMessageSize = muxerMessage
	return &cfg
}

// securityOptions returns the connection security of p: without a swarm
// key Noise or TLS 1.3 (negotiated); with one in mode "noise" only Noise,
// its handshake bound to the key (psk.go; TLS has no place for it); in
// mode "pnet" Noise or TLS inside libp2p's private network.
func securityOptions(p hostParams) (libp2p.Option, error) {
	both := libp2p.ChainOptions(libp2p.Security(noise.ID, noise.New), libp2p.Security(libp2ptls.ID, libp2ptls.New))
	switch {
	case p.psk == nil:
		return both, nil
	case p.pskMode == config.SwarmKeyPnet:
		return libp2p.ChainOptions(both, libp2p.PrivateNetwork(p.psk)), nil
	}
	log := p.log
	if log == nil {
		log = zap.NewNop()
	}
	ctor, err := newPSKNoise(p.psk, log)
	if err != nil {
		return nil, err
	}
	return libp2p.Security(noise.ID, ctor), nil
}

// SecurityOption returns the connection security a node with swarm key psk
// (nil: none) in node.swarm_key_mode mode uses, for a bare libp2p host that
// must reach the cluster's nodes (a test's misbehaving member).
func SecurityOption(psk pnet.PSK, mode string, log *zap.Logger) (libp2p.Option, error) {
	return securityOptions(hostParams{psk: psk, pskMode: mode, log: log})
}

func newHost(p hostParams) (host.Host, *connmgr.BasicConnMgr, error) {
	cm, err := connmgr.NewConnManager(p.maxPeers+8, 2*p.maxPeers+16, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, nil, fmt.Errorf("node: connection manager: %w", err)
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(resourceLimits(p.maxPeers)))
	if err != nil {
		return nil, nil, fmt.Errorf("node: resource manager: %w", err)
	}
	security, err := securityOptions(p)
	if err != nil {
		rm.Close()
		return nil, nil, err
	}
	opts := []libp2p.Option{
		libp2p.Identity(p.identity),
		libp2p.ListenAddrs(p.listen...),
		libp2p.Transport(tcp.NewTCPTransport),
		security,
		libp2p.Muxer(yamux.ID, muxer()),
		libp2p.ConnectionManager(cm),
		libp2p.ResourceManager(rm),
		libp2p.BandwidthReporter(p.bw),
		libp2p.DisableMetrics(),
		libp2p.UserAgent("p2ptrain/" + Version),
	}
	opts = append(opts, natOptions(p.nat, p.maxPeers)...)
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		hint := ""
		if strings.Contains(err.Error(), "address already in use") { // the swarm's error keeps only the text
			hint = "; another process holds the port: pick another with --listen"
		}
		return nil, nil, fmt.Errorf("node: start libp2p host on node.listen %v%s: %w", p.listen, hint, err)
	}
	return h, cm, nil
}
