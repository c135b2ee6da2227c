// Package memtransport is an in-memory allreduce.Transport for tests and the
// in-process benchmark: a Network of peers joined by reliable ordered links,
// with optional per-peer bandwidth (uplink and downlink, shared by all of a
// peer's links, like a NIC shaped with tc) and latency, and failure
// injection: kill a peer, break a link, delay a link, inject raw frames, or
// intercept every send with a hook.
//
// Pacing uses the clock (time.Now, timers), so under testing/synctest a
// simulated transfer of minutes takes milliseconds of real time.
package memtransport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
)

// Errors returned by Send and Recv.
var (
	// ErrLinkBroken: the link was broken (Break, Kill, or a Reset of either end).
	ErrLinkBroken = errors.New("memtransport: link broken")
	// ErrDead: this peer was killed or reset.
	ErrDead = errors.New("memtransport: peer dead")
)

// Shape describes a peer's network interface.
type Shape struct {
	// Up and Down are the uplink and downlink rates in bytes/s (0: unlimited).
	Up, Down float64
	// Latency is added to every frame the peer sends.
	Latency time.Duration
}

// Options configure a Network.
type Options struct {
	// Capacity is the number of frames a link buffers before Send blocks
	// (default 4096).
	Capacity int
	// MaxFrame makes Recv refuse longer frames with an error wrapping
	// allreduce.ErrFrameTooLarge (0: no limit).
	MaxFrame int
	// Exact paces without pacerSlack: a frame never starts before the
	// interface's previous one ended or before it was handed over, so a
	// link that sat idle gets no burst. For virtual time
	// (testing/synctest), where sleepers wake on time, this is the exact
	// store-and-forward model that allreduce.Model describes.
	Exact bool
}

// Hook is called before every Send with the frame about to be sent (do not
// retain it). Returning an error fails that Send. The hook may call Network
// methods (Kill, Break, ...).
type Hook func(from, to allreduce.PeerID, frame []byte) error

// Network is a set of in-memory links.
type Network struct {
	opts Options

	mu     sync.Mutex
	links  map[[2]allreduce.PeerID]*link
	shapes map[allreduce.PeerID]*pacers
	dead   map[allreduce.PeerID]error
	delays map[[2]allreduce.PeerID]time.Duration
	hook   Hook
	sent   map[allreduce.PeerID]int
	// bytesOut and bytesIn count the bytes of frames sent by and to each
	// peer, with the 4-byte length prefix a stream transport adds.
	bytesOut, bytesIn map[allreduce.PeerID]int64
}

type entry struct {
	frame   []byte
	readyAt time.Time
}

type link struct {
	q       []entry
	broken  error
	changed chan struct{}
}

func (l *link) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

type pacer struct {
	rate float64
	next time.Time
	// slack is pacerSlack, or 0 for an exact network.
	slack time.Duration
}

// pacerSlack is how long a pacer may have sat idle and still start the next
// frame where the last one ended. A sender that sleeps until its frame is
// through wakes a little late; a real link had the next frame queued and
// never idled, so that lateness must not add up frame after frame. (A link
// idle for longer starts afresh with at most pacerSlack of burst.)
const pacerSlack = 5 * time.Millisecond

// reserve books n bytes and returns when they are through.
func (p *pacer) reserve(now time.Time, n int) time.Time {
	if p == nil || p.rate <= 0 {
		return now
	}
	start := p.next
	if start.Before(now.Add(-p.slack)) {
		start = now.Add(-p.slack)
	}
	p.next = start.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	return p.next
}

type pacers struct {
	up, down *pacer
	latency  time.Duration
}

// New returns an empty Network.
func New(opts Options) *Network {
	if opts.Capacity <= 0 {
		opts.Capacity = 4096
	}
	return &Network{
		opts:     opts,
		links:    make(map[[2]allreduce.PeerID]*link),
		shapes:   make(map[allreduce.PeerID]*pacers),
		dead:     make(map[allreduce.PeerID]error),
		delays:   make(map[[2]allreduce.PeerID]time.Duration),
		sent:     make(map[allreduce.PeerID]int),
		bytesOut: make(map[allreduce.PeerID]int64),
		bytesIn:  make(map[allreduce.PeerID]int64),
	}
}

// Endpoint returns peer self's Transport.
func (n *Network) Endpoint(self allreduce.PeerID) *Endpoint { return &Endpoint{n: n, self: self} }

// SetShape sets a peer's interface rates and latency.
func (n *Network) SetShape(p allreduce.PeerID, s Shape) {
	n.mu.Lock()
	defer n.mu.Unlock()
	slack := pacerSlack
	if n.opts.Exact {
		slack = 0
	}
	n.shapes[p] = &pacers{up: &pacer{rate: s.Up, slack: slack}, down: &pacer{rate: s.Down, slack: slack}, latency: s.Latency}
}

// SetDelay adds d of latency to frames sent from → to from now on.
func (n *Network) SetDelay(from, to allreduce.PeerID, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delays[[2]allreduce.PeerID{from, to}] = d
}

// SetHook installs h (nil removes it).
func (n *Network) SetHook(h Hook) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hook = h
}

// Sent returns how many frames p has sent.
func (n *Network) Sent(p allreduce.PeerID) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent[p]
}

// Traffic returns the bytes of the frames p has sent and those sent to
// it, each with the 4-byte length prefix allreduce.WriteFrame puts on a
// stream: what p's link would carry, framing of the lower layers aside.
func (n *Network) Traffic(p allreduce.PeerID) (sent, received int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bytesOut[p], n.bytesIn[p]
}

// Kill makes p dead: its pending and later Send/Recv fail with ErrDead and
// every link to or from it breaks (frames already queued to others are still
// delivered first).
func (n *Network) Kill(p allreduce.PeerID) { n.kill(p, ErrDead) }

func (n *Network) kill(p allreduce.PeerID, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dead[p] == nil {
		n.dead[p] = err
	}
	for k, l := range n.links {
		if k[0] == p || k[1] == p {
			if l.broken == nil {
				l.broken = fmt.Errorf("%w: %s", ErrLinkBroken, p)
			}
			l.notify()
		}
	}
}

// Break breaks the links a → b and b → a.
func (n *Network) Break(a, b allreduce.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, k := range [][2]allreduce.PeerID{{a, b}, {b, a}} {
		l := n.link(k)
		if l.broken == nil {
			l.broken = fmt.Errorf("%w: %s-%s", ErrLinkBroken, a, b)
		}
		l.notify()
	}
}

// Inject queues raw bytes on the link from → to as if from had sent them
// (no pacing, no hook).
func (n *Network) Inject(from, to allreduce.PeerID, frame []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.link([2]allreduce.PeerID{from, to})
	l.q = append(l.q, entry{frame: append([]byte(nil), frame...), readyAt: time.Now()})
	l.notify()
}

// link returns the link for k; n.mu must be held.
func (n *Network) link(k [2]allreduce.PeerID) *link {
	l := n.links[k]
	if l == nil {
		l = &link{changed: make(chan struct{})}
		if err := n.dead[k[0]]; err != nil {
			l.broken = fmt.Errorf("%w: %s", ErrLinkBroken, k[0])
		} else if err := n.dead[k[1]]; err != nil {
			l.broken = fmt.Errorf("%w: %s", ErrLinkBroken, k[1])
		}
		n.links[k] = l
	}
	return l
}

// Endpoint is one peer's allreduce.Transport on a Network.
type Endpoint struct {
	n    *Network
	self allreduce.PeerID
}

var _ allreduce.Transport = (*Endpoint)(nil)

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Send implements allreduce.Transport.
func (e *Endpoint) Send(ctx context.Context, to allreduce.PeerID, frame []byte) error {
	n := e.n
	n.mu.Lock()
	if err := n.dead[e.self]; err != nil {
		n.mu.Unlock()
		return err
	}
	h := n.hook
	n.mu.Unlock()
	if h != nil {
		if err := h(e.self, to, frame); err != nil {
			return err
		}
	}
	f := append([]byte(nil), frame...)
	n.mu.Lock()
	ps := n.shapes[e.self]
	now := time.Now()
	var done time.Time
	var lat time.Duration
	if ps != nil {
		done = ps.up.reserve(now, len(f))
		lat = ps.latency
	}
	lat += n.delays[[2]allreduce.PeerID{e.self, to}]
	n.mu.Unlock()
	if err := sleepUntil(ctx, done); err != nil {
		return err
	}
	k := [2]allreduce.PeerID{e.self, to}
	n.mu.Lock()
	defer n.mu.Unlock()
	for {
		if err := n.dead[e.self]; err != nil {
			return err
		}
		l := n.link(k)
		if l.broken != nil {
			return l.broken
		}
		if len(l.q) < n.opts.Capacity {
			l.q = append(l.q, entry{frame: f, readyAt: time.Now().Add(lat)})
			n.sent[e.self]++
			n.bytesOut[e.self] += int64(len(f)) + 4
			n.bytesIn[to] += int64(len(f)) + 4
			l.notify()
			return nil
		}
		ch := l.changed
		n.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			n.mu.Lock()
			return ctx.Err()
		}
		n.mu.Lock()
	}
}

// Recv implements allreduce.Transport.
func (e *Endpoint) Recv(ctx context.Context, from allreduce.PeerID) ([]byte, error) {
	n := e.n
	k := [2]allreduce.PeerID{from, e.self}
	n.mu.Lock()
	var ent entry
	for {
		if err := n.dead[e.self]; err != nil {
			n.mu.Unlock()
			return nil, err
		}
		l := n.link(k)
		if len(l.q) > 0 {
			ent = l.q[0]
			l.q[0] = entry{}
			l.q = l.q[1:]
			l.notify()
			break
		}
		if l.broken != nil {
			n.mu.Unlock()
			return nil, l.broken
		}
		ch := l.changed
		n.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		n.mu.Lock()
	}
	n.mu.Unlock()
	if n.opts.MaxFrame > 0 && len(ent.frame) > n.opts.MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes from %s", allreduce.ErrFrameTooLarge, len(ent.frame), from)
	}
	if err := sleepUntil(ctx, ent.readyAt); err != nil {
		return nil, err
	}
	n.mu.Lock()
	ps := n.shapes[e.self]
	var done time.Time
	if ps != nil {
		done = ps.down.reserve(time.Now(), len(ent.frame))
	}
	n.mu.Unlock()
	if err := sleepUntil(ctx, done); err != nil {
		return nil, err
	}
	return ent.frame, nil
}

// Reset implements allreduce.Transport: it breaks every link of this peer.
func (e *Endpoint) Reset(reason error) {
	e.n.kill(e.self, fmt.Errorf("%w: reset: %v", ErrDead, reason))
}
