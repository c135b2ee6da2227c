package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/p2ptrain/p2ptrain/config"
)

// WireCost is what one message costs the processors of the two peers it
// passes between, measured on this machine over the cluster's own
// transport (TCP, the secure channel and yamux): Message seconds for
// each message whatever its size (the muxer's and the channel's framing,
// a write and a read system call, waking the reader) and Byte seconds for
// each byte it carries (encryption, decryption, copies, the kernel's
// work). On a peer whose processor also computes, these seconds are not
// spent computing.
type WireCost struct {
	Message, Byte float64
}

// wireCostProtocol is the stream protocol of MeasureWireCost's two hosts.
// They live in one process and serve nobody else: a daemon never speaks it.
const wireCostProtocol = protocol.ID("/p2ptrain/wirecost/1")

// Sizes MeasureWireCost's messages have: a small one, whose round trip is
// almost all per-message cost, and a large one (two full secure-channel
// records), whose difference to it is the per-byte cost.
const (
	wireCostSmall = 64
	wireCostLarge = 128 << 10
)

// MeasureWireCost times the cluster's transport on this machine: two
// libp2p hosts on 127.0.0.1 with the security of swarm key psk (nil: none)
// in node.swarm_key_mode mode bounce a message of 64 bytes and one of
// 128 KiB against a 1-byte reply, rounds times each after one untimed
// round, and keep each size's median round trip. A round trip is two
// messages, so Message is half the small one's and Byte the difference of
// the two over the difference of their sizes. Both hosts run in this
// process: run it on the processors a peer computes on (GOMAXPROCS, CPU
// affinity) and the figures are that peer's, sending and receiving.
func MeasureWireCost(ctx context.Context, psk pnet.PSK, mode string, rounds int) (WireCost, error) {
	if rounds < 1 {
		return WireCost{}, fmt.Errorf("node: measuring the transport with %d rounds, want at least 1", rounds)
	}
	if psk != nil && mode == "" {
		mode = config.SwarmKeyNoise
	}
	hosts := make([]host.Host, 2)
	for i := range hosts {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			return WireCost{}, fmt.Errorf("node: measuring the transport: identity: %w", err)
		}
		h, _, err := newHost(hostParams{identity: key, psk: psk, pskMode: mode, listen: []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/0")},
			maxPeers: 2, bw: metrics.NewBandwidthCounter()})
		if err != nil {
			return WireCost{}, fmt.Errorf("node: measuring the transport: %w", err)
		}
		defer h.Close()
		hosts[i] = h
	}
	hosts[1].SetStreamHandler(wireCostProtocol, echoSized)
	if err := hosts[0].Connect(ctx, peer.AddrInfo{ID: hosts[1].ID(), Addrs: hosts[1].Addrs()}); err != nil {
		return WireCost{}, fmt.Errorf("node: measuring the transport: connect over loopback: %w", err)
	}
	st, err := hosts[0].NewStream(ctx, hosts[1].ID(), wireCostProtocol)
	if err != nil {
		return WireCost{}, fmt.Errorf("node: measuring the transport: open a stream: %w", err)
	}
	defer st.Reset()
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	var rt [2]float64
	for i, size := range []int{wireCostSmall, wireCostLarge} {
		if rt[i], err = bounce(st, size, rounds); err != nil {
			return WireCost{}, fmt.Errorf("node: measuring the transport with %d-byte messages: %w", size, err)
		}
	}
	return WireCost{Message: rt[0] / 2, Byte: max(rt[1]-rt[0], 0) / float64(wireCostLarge-wireCostSmall)}, nil
}

// MeasureWireCost times the transport with this node's own security (its
// swarm key in its node.swarm_key_mode): the package's MeasureWireCost
// for its cluster.
func (n *Node) MeasureWireCost(ctx context.Context, rounds int) (WireCost, error) {
	return MeasureWireCost(ctx, n.psk, n.cfg.Node.SwarmKeyMode, rounds)
}

// bounce sends rounds+1 messages of size bytes on st, each after the
// previous one's 1-byte reply, and returns the median round trip in
// seconds of all but the first. A message starts with its size (4 bytes,
// big-endian, counted in size).
func bounce(st network.Stream, size, rounds int) (float64, error) {
	msg := make([]byte, size)
	binary.BigEndian.PutUint32(msg, uint32(size))
	reply := make([]byte, 1)
	times := make([]float64, 0, rounds)
	for r := range rounds + 1 {
		t0 := time.Now()
		if _, err := st.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(st, reply); err != nil {
			return 0, err
		}
		if r > 0 {
			times = append(times, time.Since(t0).Seconds())
		}
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// echoSized answers every sized message on st (see bounce) with one byte,
// until st ends.
func echoSized(st network.Stream) {
	defer st.Close()
	var buf []byte
	hdr := make([]byte, 4)
	for {
		if _, err := io.ReadFull(st, hdr); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr))
		if n < 4 || n > wireCostLarge {
			st.Reset()
			return
		}
		buf = slices.Grow(buf[:0], n-4)[:n-4]
		if _, err := io.ReadFull(st, buf); err != nil {
			return
		}
		if _, err := st.Write(hdr[:1]); err != nil {
			return
		}
	}
}
