// Command evilpeer is the chaos suite's misbehaving cluster member (test
// tree only, never part of the p2ptrain binary). It joins a cluster with a
// p2ptrain config file and misbehaves in one way:
//
//	silent   heartbeats and announces itself ready, but never sends a frame
//	poison   trains honestly but claims to be 5 steps ahead and serves a
//	         state full of NaN to whoever asks for it
//	flood    trains honestly but also sends 64 MiB of frames for steps far
//	         in the future to every member of each ring epoch
//	epochs   a bare gossip member (no trainer) that publishes epochs with
//	         huge, wrapping and jumping numbers, in proposals and heartbeats
//	ascent   trains, but sends its gradient times -10⁴: finite, huge and
//	         pointing uphill (what allreduce.robust is for)
//
// Usage: evilpeer --mode MODE --config FILE
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/pelletier/go-toml/v2"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/train"
)

func main() {
	mode := flag.String("mode", "", "silent, poison, flood, epochs or ascent")
	path := flag.String("config", "", "p2ptrain config `FILE`")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *mode, *path); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "evilpeer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, mode, path string) error {
	cfg := config.DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := toml.NewDecoder(bytes.NewReader(data)).Decode(&cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	log, err := zap.NewDevelopment()
	if err != nil {
		return err
	}
	if mode == "epochs" {
		return forgeEpochs(ctx, cfg, log)
	}
	var wrap func(*node.Node) train.Cluster
	opts := train.Options{Log: log}
	switch mode {
	case "ascent":
		wrap = func(n *node.Node) train.Cluster { return n }
		opts.GradHook = func(_ uint64, _ int, g []float32) {
			for i := range g {
				g[i] *= -1e4
			}
		}
	case "silent":
		wrap = func(n *node.Node) train.Cluster { return silent{n} }
	case "poison":
		wrap = func(n *node.Node) train.Cluster { return &poison{Node: n} }
	case "flood":
		wrap = func(n *node.Node) train.Cluster { return flood{n} }
	default:
		return fmt.Errorf("unknown --mode %q", mode)
	}
	n, err := node.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer n.Kill()
	fmt.Println("evilpeer", mode, n.ID())
	tr, err := train.New(wrap(n), cfg.Train, cfg.Allreduce, opts)
	if err != nil {
		return err
	}
	defer tr.Close()
	_, err = tr.Run(ctx)
	<-ctx.Done() // stay a member until the suite stops us
	return err
}

// silent never sends a frame.
type silent struct{ *node.Node }

func (s silent) OpenTransport(r allreduce.Ring) allreduce.EpochTransport {
	return mute{s.Node.OpenTransport(r)}
}

type mute struct{ allreduce.EpochTransport }

func (mute) Send(context.Context, allreduce.PeerID, []byte) error { return nil }

// poison claims a higher step than it holds and serves NaN parameters.
type poison struct {
	*node.Node
	mu    sync.Mutex
	step  uint64 // the step it really holds
	inner func(from string, step uint64) ([]byte, error)
}

func (p *poison) Announce(payload []byte, step uint64) {
	pl, err := train.DecodePayload(payload)
	if err == nil && pl.Ready != nil {
		p.mu.Lock()
		p.step = pl.Ready.Step
		p.mu.Unlock()
		pl.Ready.Step += 5
		pl.Ready.Hash = "0000000000000000000000000000000000000000000000000000000000000000"
		payload = pl.Encode()
	}
	p.Node.Announce(payload, step+5)
}

func (p *poison) ServeState(src func(from string, step uint64) ([]byte, error)) {
	p.mu.Lock()
	p.inner = src
	p.mu.Unlock()
	if src == nil {
		p.Node.ServeState(nil)
		return
	}
	p.Node.ServeState(func(from string, step uint64) ([]byte, error) {
		p.mu.Lock()
		inner, real := p.inner, p.step
		p.mu.Unlock()
		b, err := inner(from, real)
		if err != nil {
			return nil, err
		}
		c, err := model.UnmarshalCheckpoint(b)
		if err != nil {
			return nil, err
		}
		nan := math.Float32bits(float32(math.NaN()))
		for i := 0; i+4 <= len(c.Params); i += 4 {
			binary.LittleEndian.PutUint32(c.Params[i:], nan)
		}
		c.Step = int64(step)
		return c.Marshal(), nil
	})
}

// flood sends 64 MiB of far-future frames to every member of each epoch.
type flood struct{ *node.Node }

func (f flood) OpenTransport(r allreduce.Ring) allreduce.EpochTransport {
	t := f.Node.OpenTransport(r)
	go func() {
		payload := make([]byte, 1<<20)
		for i := range 64 {
			for _, p := range r.Peers {
				if p == r.Self {
					continue
				}
				h := allreduce.Header{Phase: allreduce.PhaseReduce, Epoch: r.Number, Step: 1 << 40, Chunk: uint32(i)}
				if t.Send(context.Background(), p, allreduce.MarshalFrame(nil, h, payload)) != nil {
					return
				}
			}
		}
	}()
	return t
}

// forgeEpochs joins the control topic as a bare gossip member and
// publishes forged epochs until ctx ends.
func forgeEpochs(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	opts := []libp2p.Option{libp2p.ListenAddrStrings(cfg.Node.Listen...)}
	if cfg.Node.SwarmKey != "" {
		psk, err := node.LoadSwarmKey(cfg.Node.SwarmKey)
		if err != nil {
			return err
		}
		// The cluster's own security (node.swarm_key_mode): with "noise", a
		// host inside libp2p's private network could not reach a node at
		// all, and the forged epochs would never be sent.
		sec, err := node.SecurityOption(psk, cfg.Node.SwarmKeyMode, log)
		if err != nil {
			return err
		}
		opts = append(opts, sec)
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		return err
	}
	defer h.Close()
	ps, err := pubsub.NewGossipSub(ctx, h)
	if err != nil {
		return err
	}
	topic, err := ps.Join(gossip.Topic(cfg.Node.Cluster))
	if err != nil {
		return err
	}
	sub, err := topic.Subscribe()
	if err != nil {
		return err
	}
	defer sub.Cancel()
	for _, b := range cfg.Node.Bootstrap {
		ai, err := peer.AddrInfoFromString(b)
		if err != nil {
			return err
		}
		if err := connect(ctx, h, *ai); err != nil {
			return fmt.Errorf("connect %s: %w", b, err)
		}
	}
	fmt.Println("evilpeer epochs", h.ID())
	self := h.ID().String()
	publish := func(env *gossip.Envelope) error {
		env.V, env.Cluster = gossip.WireVersion, cfg.Node.Cluster
		b, err := gossip.Encode(env)
		if err != nil {
			return err
		}
		return topic.Publish(ctx, b)
	}
	forged := func(n uint64) gossip.Epoch {
		return gossip.Epoch{Number: n, Order: []string{self}, Coordinator: self}
	}
	numbers := []uint64{math.MaxUint64 - 1, gossip.MaxEpochNumber + 1, 1 << 40}
	for seq := uint64(time.Now().UnixNano()); ctx.Err() == nil; seq++ {
		n := numbers[seq%uint64(len(numbers))]
		hb := gossip.Heartbeat{PeerID: self, Name: "evil", Version: "evil", Seq: seq, Epoch: forged(n)}
		e := forged(n)
		if err := errors.Join(publish(&gossip.Envelope{Type: gossip.TypeHeartbeat, Heartbeat: &hb}),
			publish(&gossip.Envelope{Type: gossip.TypeEpoch, Epoch: &e})); err != nil && ctx.Err() == nil {
			log.Warn("publish", zap.Error(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// connect dials ai until it answers, for up to 30 s (the bootstrap peer
// may not listen yet when the suite starts this one).
func connect(ctx context.Context, h host.Host, ai peer.AddrInfo) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := h.Connect(ctx, ai)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
		if sw, ok := h.Network().(*swarm.Swarm); ok {
			sw.Backoff().Clear(ai.ID) // or the next dials fail at once for seconds
		}
	}
}
