// Package probe implements the probe protocol (/p2ptrain/probe/1.0.0): it
// measures the round-trip time and throughput from this peer to the
// cluster's members in the background, within a duty cycle, and answers the
// other members' probes.
package probe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/internal/ctxutil"
)

// The protocol (ID) measures the round-trip time and
// the throughput from the client to the server. The client sends requests of
// a 6-byte header: version (1), op, and a 4-byte little-endian length.
//
//   - ping (op 1, length 0): the server answers one byte.
//   - upload (op 2, length N, 1 ≤ N ≤ MaxBytes): N payload bytes follow;
//     once it has read them all the server answers N (4 bytes, little-endian).
//
// A stream carries at most probeMaxRequests requests and 2·MaxBytes of
// payload within probeStreamTimeout, and a server serves one probe stream per
// peer at a time; anything else resets the stream.

const (
	probeVersion   byte = 1
	probeOpPing    byte = 1
	probeOpUpload  byte = 2
	probeHeaderLen      = 6

	// MaxBytes bounds one upload a probe server accepts.
	MaxBytes = 16 << 20
	// MinBytes is the smallest upload a Prober sends.
	MinBytes = 64 << 10
	// probeStartBytes is the first upload to a peer; later probes adapt the
	// size so an upload takes about probeTarget.
	probeStartBytes = 256 << 10
	// probeTarget is the duration an upload aims at.
	probeTarget = 100 * time.Millisecond
	// probePings RTT samples are taken (after one warm-up), the median kept.
	probePings = 5
	// probeMaxRequests bounds the requests of one stream.
	probeMaxRequests = 2 * (probePings + 3)
	// probeStreamTimeout bounds a whole probe, on both sides.
	probeStreamTimeout = 10 * time.Second
	// probeIOBuf is the size of the buffers uploads are written from and read into.
	probeIOBuf = 32 << 10
	// probeFirstJitter spreads the first probe of a newly seen peer.
	probeFirstJitter = time.Second
	// probeMaxIdle bounds how long the probe loop sleeps before it looks at
	// membership again.
	probeMaxIdle = time.Second
	// probeWarmupDuty is the share of time first measurements of new peers
	// may take (they are not held to Config.DutyCycle, so a new cluster
	// gets its first figures within seconds).
	probeWarmupDuty = 0.25
)

// ID is the probe protocol's libp2p protocol ID.
const ID protocol.ID = "/p2ptrain/probe/1.0.0"

// Config is how a Prober measures.
type Config struct {
	// Interval is the least time between two probes of the same peer.
	Interval time.Duration
	// MaxBytes bounds one probe upload (MinBytes..MaxBytes; sizes adapt so a
	// probe takes about 100 ms).
	MaxBytes int
	// DutyCycle is the largest share of time this peer spends probing.
	DutyCycle float64
}

// errProbe reports a probe protocol violation or failure.
var errProbe = errors.New("probe")

// LinkStatus is this peer's latest measurement of its link to another member.
type LinkStatus struct {
	Peer string `json:"peer"`
	// MbitS is the throughput from this peer to Peer in Mbit/s (10^6 bit/s):
	// the highest of the last probeWindow probes.
	MbitS float64 `json:"mbit_s"`
	// RTTMs is the round-trip time in milliseconds (median of a few pings):
	// the lowest of the last probeWindow probes.
	RTTMs float64 `json:"rtt_ms"`
	// MeasuredAt is when the latest probe finished.
	MeasuredAt time.Time `json:"measured_at"`
}

// probeSample is the result of one probe.
type probeSample struct {
	rtt     time.Duration
	bytesPS float64
	// bytes is the upload the figure comes from; next is the size the next
	// probe should use; took is the probe's whole duration.
	bytes, next int
	took        time.Duration
}

// probeWindow is how many recent probes a link's figures come from: the
// highest throughput and the lowest round trip among them, the filters
// TCP BBR uses for a path's bottleneck bandwidth and propagation delay.
// What disturbs a probe (CPU load on either peer, training traffic on the
// same link, a queue) only lowers its throughput and lengthens its round
// trip, so the extreme of a few probes is the link's and an average is
// not: on equal links with busy CPUs, averaged figures differed by tens of
// percent, and the planner took proportional shares the links did not
// have. A link that really slows down shows once its faster probes have
// left the window: after probeWindow probes (probe.interval apart).
const probeWindow = 3

// linkSample is one probe's figures.
type linkSample struct{ mbit, rtt float64 }

// linkState is what the Prober keeps per peer.
type linkState struct {
	status   LinkStatus
	measured bool
	// recent holds the last probeWindow probes' figures, oldest first.
	recent []linkSample
	// due is when the peer may be probed next; size the next upload.
	due  time.Time
	size int
}

// Prober measures links to the cluster's members in the background and
// serves other peers' probes.
type Prober struct {
	h   host.Host
	cfg Config
	log *zap.Logger

	mu    sync.Mutex
	links map[peer.ID]*linkState
	// nextAny spaces probes of already measured peers node-wide, so all of
	// this peer's probes together stay within cfg.DutyCycle; nextFirst spaces
	// first measurements (warm-up) to at most probeWarmupDuty.
	nextAny, nextFirst time.Time
	serving            map[peer.ID]bool
}

// New registers the probe protocol's server on h; Run starts the probing.
func New(h host.Host, cfg Config, log *zap.Logger) *Prober {
	p := &Prober{h: h, cfg: cfg, log: log, links: map[peer.ID]*linkState{}, serving: map[peer.ID]bool{}}
	h.SetStreamHandler(ID, p.serve)
	return p
}

// serve answers one probe stream.
func (p *Prober) serve(s network.Stream) {
	remote := s.Conn().RemotePeer()
	p.mu.Lock()
	busy := p.serving[remote]
	p.serving[remote] = true
	p.mu.Unlock()
	if busy {
		p.log.Debug("probe refused: another probe from this peer is running", zap.Stringer("peer", remote))
		_ = s.Reset()
		return
	}
	err := serveProbe(s)
	// Free the slot before the client sees the stream end, so its next probe
	// is served.
	p.mu.Lock()
	delete(p.serving, remote)
	p.mu.Unlock()
	if err != nil {
		p.log.Debug("probe stream reset", zap.Stringer("peer", remote), zap.Error(err))
		_ = s.Reset()
		return
	}
	_ = s.Close()
}

// serveProbe runs the server side of one stream until the client closes it
// (nil) or breaks the protocol (an error).
func serveProbe(s io.ReadWriter) error {
	if d, ok := s.(interface{ SetDeadline(time.Time) error }); ok {
		_ = d.SetDeadline(time.Now().Add(probeStreamTimeout))
	}
	var hdr [probeHeaderLen]byte
	total := 0
	for req := 0; ; req++ {
		if _, err := io.ReadFull(s, hdr[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("%w: read request: %w", errProbe, err)
		}
		if req >= probeMaxRequests {
			return fmt.Errorf("%w: more than %d requests", errProbe, probeMaxRequests)
		}
		n := int(binary.LittleEndian.Uint32(hdr[2:]))
		switch {
		case hdr[0] != probeVersion:
			return fmt.Errorf("%w: version %d (want %d)", errProbe, hdr[0], probeVersion)
		case hdr[1] == probeOpPing && n == 0:
			if _, err := s.Write([]byte{probeOpPing}); err != nil {
				return fmt.Errorf("%w: answer ping: %w", errProbe, err)
			}
		case hdr[1] == probeOpUpload:
			if n < 1 || n > MaxBytes {
				return fmt.Errorf("%w: upload of %d bytes (max %d)", errProbe, n, MaxBytes)
			}
			if total += n; total > 2*MaxBytes {
				return fmt.Errorf("%w: more than %d bytes on one stream", errProbe, 2*MaxBytes)
			}
			if _, err := io.CopyN(io.Discard, s, int64(n)); err != nil {
				return fmt.Errorf("%w: read upload: %w", errProbe, err)
			}
			var ack [4]byte
			binary.LittleEndian.PutUint32(ack[:], uint32(n))
			if _, err := s.Write(ack[:]); err != nil {
				return fmt.Errorf("%w: answer upload: %w", errProbe, err)
			}
		default:
			return fmt.Errorf("%w: bad request op %d length %d", errProbe, hdr[1], n)
		}
	}
}

// probePeer measures the link to id over one new stream (it does not dial):
// the median of probePings RTTs, then an upload of size bytes, and one
// larger upload if the first was much shorter than probeTarget.
func probePeer(ctx context.Context, h host.Host, id peer.ID, size, maxBytes int) (probeSample, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, probeStreamTimeout)
	defer cancel()
	s, err := h.NewStream(network.WithNoDial(ctx, "probe"), id, ID)
	if err != nil {
		return probeSample{}, fmt.Errorf("%w %s: open stream: %w", errProbe, id, err)
	}
	// The stream's deadline bounds every read and write; cancellation resets it.
	_ = s.SetDeadline(time.Now().Add(probeStreamTimeout))
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	defer stop()
	smp, err := probeStream(s, size, maxBytes)
	if err != nil {
		_ = s.Reset()
		return probeSample{}, fmt.Errorf("%w %s: %w", errProbe, id, err)
	}
	// End cleanly: close our side and wait for the server's end.
	if err := s.CloseWrite(); err == nil {
		var one [1]byte
		_, err = io.ReadFull(s, one[:])
		if err != io.EOF {
			_ = s.Reset()
			return probeSample{}, fmt.Errorf("%w %s: end of stream: %v", errProbe, id, err)
		}
	}
	_ = s.Close()
	smp.took = time.Since(start)
	return smp, nil
}

// probeStream runs the client side of a probe on s.
func probeStream(s io.ReadWriter, size, maxBytes int) (probeSample, error) {
	maxBytes = min(max(maxBytes, MinBytes), MaxBytes)
	size = min(max(size, MinBytes), maxBytes)
	hdr := func(op byte, n int) []byte {
		b := []byte{probeVersion, op, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[2:], uint32(n))
		return b
	}
	// The first ping also pays for protocol negotiation: a warm-up.
	rtts := make([]time.Duration, 0, probePings)
	var one [1]byte
	for i := 0; i <= probePings; i++ {
		t := time.Now()
		if _, err := s.Write(hdr(probeOpPing, 0)); err != nil {
			return probeSample{}, fmt.Errorf("ping: %w", err)
		}
		if _, err := io.ReadFull(s, one[:]); err != nil {
			return probeSample{}, fmt.Errorf("ping answer: %w", err)
		}
		if one[0] != probeOpPing {
			return probeSample{}, fmt.Errorf("ping answer %d", one[0])
		}
		if i > 0 {
			rtts = append(rtts, time.Since(t))
		}
	}
	slices.Sort(rtts)
	rtt := rtts[len(rtts)/2]
	payload := make([]byte, probeIOBuf)
	upload := func(n int) (float64, time.Duration, error) {
		t := time.Now()
		if _, err := s.Write(hdr(probeOpUpload, n)); err != nil {
			return 0, 0, fmt.Errorf("upload: %w", err)
		}
		for left := n; left > 0; {
			k := min(left, len(payload))
			if _, err := s.Write(payload[:k]); err != nil {
				return 0, 0, fmt.Errorf("upload: %w", err)
			}
			left -= k
		}
		var ack [4]byte
		if _, err := io.ReadFull(s, ack[:]); err != nil {
			return 0, 0, fmt.Errorf("upload answer: %w", err)
		}
		if got := int(binary.LittleEndian.Uint32(ack[:])); got != n {
			return 0, 0, fmt.Errorf("upload answer %d, sent %d", got, n)
		}
		took := time.Since(t)
		// The answer costs about one RTT: leave it out, but never count more
		// than half the upload as waiting.
		d := max(took-rtt, took/2, time.Microsecond)
		return float64(n) / d.Seconds(), took, nil
	}
	bps, took, err := upload(size)
	if err != nil {
		return probeSample{}, err
	}
	ideal := func(bps float64) int {
		n := bps * probeTarget.Seconds()
		return int(min(max(n, MinBytes), float64(maxBytes)))
	}
	next := ideal(bps)
	if took < probeTarget/4 && next >= 2*size {
		// Far too short to be a good measurement: once more at the right size.
		size = next
		if bps, _, err = upload(size); err != nil {
			return probeSample{}, err
		}
		next = ideal(bps)
	}
	return probeSample{rtt: rtt, bytesPS: bps, bytes: size, next: next}, nil
}

// Run probes every target (the connected live members) in the background
// until ctx ends: a newly seen peer within probeFirstJitter, then each peer
// at most once per cfg.Interval (with up to 10% jitter) and, node-wide, no
// more than cfg.DutyCycle of the time.
func (p *Prober) Run(ctx context.Context, targets func() []peer.ID) {
	for {
		now := time.Now()
		id, size, wait := p.pick(now, targets())
		if id == "" {
			if !ctxutil.Sleep(ctx, wait) {
				return
			}
			continue
		}
		smp, err := probePeer(ctx, p.h, id, size, p.cfg.MaxBytes)
		if ctx.Err() != nil {
			return
		}
		p.record(id, smp, err, now, time.Now())
	}
}

// pick returns the peer to probe now and the upload size, or how long to
// wait before looking again. It forgets peers that are no longer targets.
func (p *Prober) pick(now time.Time, targets []peer.ID) (peer.ID, int, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := make(map[peer.ID]bool, len(targets))
	for _, id := range targets {
		want[id] = true
		if _, ok := p.links[id]; !ok {
			p.links[id] = &linkState{due: now.Add(rand.N(probeFirstJitter)), size: probeStartBytes}
		}
	}
	for id := range p.links {
		if !want[id] {
			delete(p.links, id)
		}
	}
	wait := probeMaxIdle
	var best peer.ID
	var bestDue time.Time
	for id, l := range p.links {
		due := l.due
		switch {
		case l.measured && due.Before(p.nextAny):
			due = p.nextAny
		case !l.measured && due.Before(p.nextFirst):
			due = p.nextFirst
		}
		if d := due.Sub(now); d > 0 {
			wait = min(wait, d)
			continue
		}
		if best == "" || due.Before(bestDue) {
			best, bestDue = id, due
		}
	}
	if best == "" {
		return "", 0, wait
	}
	return best, p.links[best].size, 0
}

// record stores a probe's outcome and schedules the next probes.
func (p *Prober) record(id peer.ID, smp probeSample, err error, start, end time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	took := max(end.Sub(start), time.Millisecond)
	l, ok := p.links[id]
	if err != nil {
		// A failed probe moved little data: only this peer waits.
		p.nextAny = later(p.nextAny, end.Add(probeMaxIdle))
		p.nextFirst = later(p.nextFirst, end)
		if ok {
			l.due = end.Add(p.cfg.Interval)
		}
		p.log.Debug("probe failed", zap.Stringer("peer", id), zap.Error(err))
		return
	}
	// Duty cycle: after a probe of d, the next probe waits d/duty (node-wide)
	// and this peer's next probe at least that long too.
	gap := time.Duration(float64(took) / p.cfg.DutyCycle)
	p.nextAny = start.Add(gap)
	p.nextFirst = start.Add(time.Duration(float64(took) / probeWarmupDuty))
	if !ok {
		return // no longer a target
	}
	interval := max(p.cfg.Interval, gap)
	l.due = end.Add(interval + rand.N(interval/10+1))
	l.size = smp.next
	if len(l.recent) == probeWindow {
		l.recent = append(l.recent[:0], l.recent[1:]...)
	}
	l.recent = append(l.recent, linkSample{mbit: smp.bytesPS * 8 / 1e6, rtt: smp.rtt.Seconds() * 1e3})
	mbit, rtt := l.recent[0].mbit, l.recent[0].rtt
	for _, r := range l.recent[1:] {
		mbit, rtt = max(mbit, r.mbit), min(rtt, r.rtt)
	}
	l.status = LinkStatus{Peer: id.String(), MbitS: roundFigure(mbit), RTTMs: roundFigure(rtt), MeasuredAt: end}
	l.measured = true
	p.log.Debug("link measured", zap.Stringer("peer", id), zap.Float64("mbit_s", l.status.MbitS),
		zap.Float64("rtt_ms", l.status.RTTMs), zap.Int("bytes", smp.bytes), zap.Duration("took", smp.took))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// roundFigure keeps four significant digits of a measurement (finite, ≥ 0).
func roundFigure(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 0
	}
	scale := math.Pow(10, 3-math.Floor(math.Log10(v)))
	return math.Round(v*scale) / scale
}

// Set records a measurement directly (tests inject known links with it).
func (p *Prober) Set(st LinkStatus) {
	id, err := peer.Decode(st.Peer)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.links[id]
	if !ok {
		l = &linkState{size: probeStartBytes}
		p.links[id] = l
	}
	l.status, l.measured = st, true
	l.due = st.MeasuredAt.Add(p.cfg.Interval)
}

// Statuses returns the measured links, sorted by peer ID.
func (p *Prober) Statuses() []LinkStatus {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]LinkStatus, 0, len(p.links))
	for _, l := range p.links {
		if l.measured {
			out = append(out, l.status)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}

// Figures returns the measured links as heartbeat figures: at most
// gossip.MaxLinks, the first by peer ID.
func (p *Prober) Figures() []gossip.LinkFigure {
	st := p.Statuses()
	if len(st) == 0 {
		return nil
	}
	out := make([]gossip.LinkFigure, 0, min(len(st), gossip.MaxLinks))
	for _, s := range st[:min(len(st), gossip.MaxLinks)] {
		out = append(out, gossip.LinkFigure{Peer: s.Peer, MbitS: s.MbitS, RTTMs: s.RTTMs})
	}
	return out
}
