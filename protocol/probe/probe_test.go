package probe

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/p2ptrain/p2ptrain/internal/p2ptest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// defaultConfig is the [probe] section's default.
var defaultConfig = Config{Interval: 30 * time.Second, MaxBytes: 4 << 20, DutyCycle: 0.02}

// startPair starts two loopback hosts serving the probe protocol, a
// connected to b.
func startPair(t *testing.T) (a, b host.Host) {
	t.Helper()
	a, b = p2ptest.Pair(t)
	for _, h := range []host.Host{a, b} {
		New(h, defaultConfig, zaptest.NewLogger(t))
	}
	return a, b
}

// TestProbeLoopback probes a loopback link: both figures are positive, and
// the upload adapts towards probeTarget.
func TestProbeLoopback(t *testing.T) {
	a, b := startPair(t)
	ctx := context.Background()
	smp, err := probePeer(ctx, a, b.ID(), probeStartBytes, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if smp.rtt <= 0 || !(smp.bytesPS > 0) || smp.bytes < probeStartBytes || smp.next < MinBytes || smp.next > 4<<20 {
		t.Fatalf("probe figures %+v", smp)
	}
	t.Logf("loopback probe: rtt %v, %.0f Mbit/s (upload %d bytes, next %d), took %v",
		smp.rtt, smp.bytesPS*8/1e6, smp.bytes, smp.next, smp.took)
	// The server is free again: a second probe of the same peer works.
	if _, err := probePeer(ctx, a, b.ID(), smp.next, 4<<20); err != nil {
		t.Fatalf("second probe: %v", err)
	}
}

// rawProbe opens a probe stream from a to b and writes reqs.
func rawProbe(t *testing.T, a, b host.Host, reqs ...[]byte) io.ReadWriteCloser {
	t.Helper()
	s, err := a.NewStream(context.Background(), b.ID(), ID)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	t.Cleanup(func() { s.Reset() })
	for _, r := range reqs {
		if _, err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func probeReq(version, op byte, n uint32) []byte {
	b := []byte{version, op, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[2:], n)
	return b
}

// TestProbeServerRejects checks that the server resets streams that break the
// protocol, without reading (or allocating) what they announce.
func TestProbeServerRejects(t *testing.T) {
	a, b := startPair(t)
	tooMany := make([]byte, 0, (probeMaxRequests+1)*probeHeaderLen)
	for range probeMaxRequests + 1 {
		tooMany = append(tooMany, probeReq(probeVersion, probeOpPing, 0)...)
	}
	for _, tt := range []struct {
		name string
		req  []byte
	}{
		{"oversized upload", probeReq(probeVersion, probeOpUpload, MaxBytes+1)},
		{"huge upload", probeReq(probeVersion, probeOpUpload, 1<<32-1)},
		{"empty upload", probeReq(probeVersion, probeOpUpload, 0)},
		{"future version", probeReq(probeVersion+1, probeOpPing, 0)},
		{"unknown op", probeReq(probeVersion, 9, 0)},
		{"ping with a length", probeReq(probeVersion, probeOpPing, 4)},
		{"too many requests", tooMany},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := rawProbe(t, a, b, tt.req)
			// Every valid request before the bad one is answered; then the stream is reset.
			_, err := io.ReadAll(s)
			if err == nil {
				t.Fatal("stream ended cleanly; want a reset")
			}
		})
	}
	// One probe stream per peer at a time.
	first := rawProbe(t, a, b, probeReq(probeVersion, probeOpPing, 0))
	var one [1]byte
	if _, err := io.ReadFull(first, one[:]); err != nil {
		t.Fatalf("first stream's ping: %v", err)
	}
	second := rawProbe(t, a, b, probeReq(probeVersion, probeOpPing, 0))
	if _, err := io.ReadFull(second, one[:]); err == nil {
		t.Fatal("a second concurrent probe stream from the same peer was served")
	}
	// The first stream is still served, and ends cleanly when the client closes it.
	if _, err := first.Write(probeReq(probeVersion, probeOpPing, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(first, one[:]); err != nil {
		t.Fatalf("first stream after the refused one: %v", err)
	}
	first.(interface{ CloseWrite() error }).CloseWrite()
	if rest, err := io.ReadAll(first); err != nil || len(rest) != 0 {
		t.Fatalf("clean end: %d bytes, %v", len(rest), err)
	}
}

// TestProbeBackground checks the background loop: each peer measures the

// TestProberSchedule checks the pick/record bookkeeping with a fixed clock:
// first probes within the jitter, then once per interval, node-wide spacing
// by the duty cycle, and forgetting peers that left.
func TestProberSchedule(t *testing.T) {
	cfg := defaultConfig
	p := &Prober{cfg: cfg, log: zap.NewNop(), links: map[peer.ID]*linkState{}, serving: map[peer.ID]bool{}}
	x, y := peer.ID("x"), peer.ID("y")
	now := time.Unix(1000, 0)
	if id, _, wait := p.pick(now, []peer.ID{x, y}); id != "" && wait != 0 {
		t.Fatalf("pick %q wait %v", id, wait)
	}
	later := now.Add(probeFirstJitter)
	id, size, _ := p.pick(later, []peer.ID{x, y})
	if id == "" || size != probeStartBytes {
		t.Fatalf("no first probe once the jitter passed: %q %d", id, size)
	}
	other := x
	if id == x {
		other = y
	}
	took := 100 * time.Millisecond
	p.record(id, probeSample{rtt: time.Millisecond, bytesPS: 1e8, bytes: size, next: 1 << 20}, nil, later, later.Add(took))
	// The other peer's first probe is held back by the warm-up duty only...
	warm := later.Add(time.Duration(float64(took) / probeWarmupDuty))
	if got, _, wait := p.pick(warm.Add(-time.Millisecond), []peer.ID{x, y}); got != "" || wait != time.Millisecond {
		t.Fatalf("picked %q (wait %v) during the warm-up spacing", got, wait)
	}
	if got, _, _ := p.pick(warm, []peer.ID{x, y}); got != other {
		t.Fatalf("picked %q, want the unmeasured %q", got, other)
	}
	p.record(other, probeSample{rtt: time.Millisecond, bytesPS: 2e8, bytes: size, next: 1 << 20}, nil, later.Add(took), later.Add(2*took))
	// ...but measured peers wait for their interval and the duty cycle.
	gap := time.Duration(float64(took) / cfg.DutyCycle)
	if got, _, wait := p.pick(later.Add(2*took+time.Second), []peer.ID{x, y}); got != "" || wait <= 0 {
		t.Fatalf("picked %q (wait %v) a second after measuring it", got, wait)
	}
	due := later.Add(max(cfg.Interval, gap)*11/10 + 2*took + time.Second)
	got, size, _ := p.pick(due, []peer.ID{x, y})
	if got == "" || size != 1<<20 {
		t.Fatalf("nothing due after the interval (got %q size %d)", got, size)
	}
	st := p.Statuses()
	if len(st) != 2 || st[0].MbitS != 800 && st[1].MbitS != 800 || st[0].RTTMs != 1 {
		t.Fatalf("statuses %+v", st)
	}
	// Later figures: the highest throughput and the lowest round trip of
	// the last probeWindow probes. A disturbed probe (slower, longer round
	// trip) changes nothing; a link that slows down shows once its faster
	// probes have left the window.
	first := 0.0
	for _, s := range p.Statuses() {
		if s.Peer == got.String() {
			first = s.MbitS
		}
	}
	at := due
	figure := func(mbit float64, rtt time.Duration) LinkStatus {
		t.Helper()
		p.record(got, probeSample{rtt: rtt, bytesPS: mbit * 1e6 / 8, next: 1 << 20}, nil, at, at.Add(took))
		at = at.Add(time.Hour)
		for _, s := range p.Statuses() {
			if s.Peer == got.String() {
				return s
			}
		}
		t.Fatalf("no status for %s", got)
		return LinkStatus{}
	}
	if s := figure(first/2, 3*time.Millisecond); s.MbitS != first || s.RTTMs != 1 {
		t.Fatalf("after one disturbed probe: %+v, want the first probe's %v Mbit/s and 1 ms", s, first)
	}
	if s := figure(first/2, 3*time.Millisecond); s.MbitS != first || s.RTTMs != 1 {
		t.Fatalf("after two disturbed probes: %+v, want %v Mbit/s and 1 ms", s, first)
	}
	if s := figure(first/2, 3*time.Millisecond); s.MbitS != first/2 || s.RTTMs != 3 {
		t.Fatalf("after %d slower probes: %+v, want the slower link's %v Mbit/s and 3 ms", probeWindow, s, first/2)
	}
	if s := figure(first, 2*time.Millisecond); s.MbitS != first || s.RTTMs != 2 {
		t.Fatalf("after a faster probe: %+v, want %v Mbit/s and 2 ms at once", s, first)
	}
	// A failed probe (a timeout) keeps the old figure and holds back neither
	// this peer beyond its interval nor other peers beyond probeMaxIdle.
	fail := at.Add(time.Hour)
	p.record(got, probeSample{}, fmt.Errorf("boom"), fail, fail.Add(probeStreamTimeout))
	if len(p.Statuses()) != 2 {
		t.Fatal("a failed probe dropped the figure")
	}
	if next := p.nextAny.Sub(fail.Add(probeStreamTimeout)); next > probeMaxIdle {
		t.Fatalf("a failed probe holds back every probe for %v", next)
	}
	// y leaves: forgotten.
	p.pick(due, []peer.ID{x})
	if st := p.Statuses(); len(st) != 1 || st[0].Peer != x.String() {
		t.Fatalf("statuses after y left: %+v", st)
	}
	if f := p.Figures(); len(f) != 1 || f[0].Peer != x.String() {
		t.Fatalf("figures %+v", f)
	}
}

func TestRoundFigure(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{
		{941.23456, 941.2}, {0.0123456, 0.01235}, {12345678, 12350000}, {0, 0}, {-1, 0},
	} {
		if got := roundFigure(tt.in); got != tt.want {
			t.Errorf("roundFigure(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
