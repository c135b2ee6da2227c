package gossip

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func validHeartbeat() *Envelope {
	return &Envelope{V: WireVersion, Cluster: "lab", Type: TypeHeartbeat, Heartbeat: &Heartbeat{
		PeerID: "p1", Name: "one", Version: "0.1.0", Addrs: []string{"/ip4/127.0.0.1/tcp/1"},
		Epoch: Epoch{Number: 2, Order: []string{"p0", "p1"}, Coordinator: "p0"},
	}}
}

func TestDecodeRoundTrip(t *testing.T) {
	b, err := Encode(validHeartbeat())
	if err != nil {
		t.Fatal(err)
	}
	env, err := Decode(b, "lab", "p1")
	if err != nil {
		t.Fatal(err)
	}
	if env.Heartbeat.Name != "one" || env.Heartbeat.Epoch.Number != 2 {
		t.Fatalf("decoded %+v", env.Heartbeat)
	}
}

// TestDecodeLinksAndPlan checks that link figures and an epoch's schedule and
// shares survive the wire exactly, and that Equal compares them.
func TestDecodeLinksAndPlan(t *testing.T) {
	e := validHeartbeat()
	h := e.Heartbeat
	h.Links = []LinkFigure{{Peer: "p0", MbitS: 941.25, RTTMs: 0.081}, {Peer: "p2", MbitS: 0, RTTMs: 0}}
	third := 1.0 / 3
	h.Epoch = Epoch{Number: 4, Order: []string{"p0", "p1", "p2"}, Coordinator: "p0",
		Schedule: "proportional", Shares: []float64{third, third, 1 - 2*third},
		LinkCodecs: []string{"none", "fp16", "none"}, FinalCodec: "fp16"}
	b, err := Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	env, err := Decode(b, "lab", "p1")
	if err != nil {
		t.Fatal(err)
	}
	got := env.Heartbeat
	if !slices.Equal(got.Links, h.Links) {
		t.Fatalf("links %+v, want %+v", got.Links, h.Links)
	}
	if !got.Epoch.Equal(h.Epoch) {
		t.Fatalf("epoch %+v, want %+v", got.Epoch, h.Epoch)
	}
	other := cloneEpoch(h.Epoch)
	other.Shares[0] = math.Nextafter(other.Shares[0], 1)
	if other.Equal(h.Epoch) {
		t.Fatal("Equal ignores the shares")
	}
	other = cloneEpoch(h.Epoch)
	other.Schedule = "auto"
	if other.Equal(h.Epoch) {
		t.Fatal("Equal ignores the schedule")
	}
	other = cloneEpoch(h.Epoch)
	other.LinkCodecs[2] = "fp16"
	if other.Equal(h.Epoch) {
		t.Fatal("Equal ignores the link codecs")
	}
	other = cloneEpoch(h.Epoch)
	other.FinalCodec = "none"
	if other.Equal(h.Epoch) {
		t.Fatal("Equal ignores the final codec")
	}
	// A full heartbeat of links fits a gossip message.
	h.Links = nil
	for i := range MaxLinks {
		h.Links = append(h.Links, LinkFigure{Peer: strings.Repeat("x", 52) + fmt.Sprint(i), MbitS: math.MaxFloat64, RTTMs: math.SmallestNonzeroFloat64})
	}
	if _, err := Encode(e); err != nil {
		t.Fatalf("heartbeat with %d links: %v", MaxLinks, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	mutate := func(f func(e *Envelope)) []byte {
		e := validHeartbeat()
		f(e)
		b, err := Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name   string
		data   []byte
		author string
		want   error
	}{
		{"garbage", []byte("\x00\xffnot json"), "p1", ErrMalformed},
		{"empty", nil, "p1", ErrMalformed},
		{"unknown field", []byte(`{"v":1,"cluster":"lab","type":"leave","leave":{"peer_id":"p1"},"x":1}`), "p1", ErrMalformed},
		{"trailing data", []byte(`{"v":1,"cluster":"lab","type":"leave","leave":{"peer_id":"p1"}} {}`), "p1", ErrMalformed},
		{"oversized", []byte(`{"v":1,"cluster":"` + strings.Repeat("x", MaxMessageSize) + `"}`), "p1", ErrMalformed},
		{"foreign cluster", mutate(func(e *Envelope) { e.Cluster = "other" }), "p1", ErrForeignCluster},
		{"future version", mutate(func(e *Envelope) { e.V = WireVersion + 1 }), "p1", ErrVersion},
		{"forged sender", mutate(func(e *Envelope) {}), "p2", ErrSender},
		{"two bodies", mutate(func(e *Envelope) { e.Leave = &Leave{PeerID: "p1"} }), "p1", ErrMalformed},
		{"type mismatch", mutate(func(e *Envelope) { e.Type = TypeLeave }), "p1", ErrMalformed},
		{"no version string", mutate(func(e *Envelope) { e.Heartbeat.Version = "" }), "p1", ErrMalformed},
		{"control characters", mutate(func(e *Envelope) { e.Heartbeat.Name = "a\nb" }), "p1", ErrMalformed},
		{"too many addrs", mutate(func(e *Envelope) { e.Heartbeat.Addrs = make([]string, maxAddrs+1) }), "p1", ErrMalformed},
		{"oversized application payload", mutate(func(e *Envelope) { e.Heartbeat.App = make([]byte, MaxAppBytes+1) }), "p1", ErrMalformed},
		{"duplicate epoch member", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Order = []string{"p0", "p0"} }), "p1", ErrMalformed},
		{"coordinator outside epoch", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Coordinator = "p9" }), "p1", ErrMalformed},
		{"epoch proposal by another", mutate(func(e *Envelope) {
			e.Type, e.Heartbeat = TypeEpoch, nil
			e.Epoch = &Epoch{Number: 3, Order: []string{"p0"}, Coordinator: "p0"}
		}), "p1", ErrSender},
		{"epoch 0 proposal", mutate(func(e *Envelope) {
			e.Type, e.Heartbeat = TypeEpoch, nil
			e.Epoch = &Epoch{Coordinator: "p1"}
		}), "p1", ErrMalformed},
		{"too many links", mutate(func(e *Envelope) {
			for i := range MaxLinks + 1 {
				e.Heartbeat.Links = append(e.Heartbeat.Links, LinkFigure{Peer: fmt.Sprint("q", i), MbitS: 1})
			}
		}), "p1", ErrMalformed},
		{"link without peer", mutate(func(e *Envelope) { e.Heartbeat.Links = []LinkFigure{{MbitS: 1}} }), "p1", ErrMalformed},
		{"link listed twice", mutate(func(e *Envelope) {
			e.Heartbeat.Links = []LinkFigure{{Peer: "p0", MbitS: 1}, {Peer: "p0", MbitS: 2}}
		}), "p1", ErrMalformed},
		{"negative throughput", mutate(func(e *Envelope) { e.Heartbeat.Links = []LinkFigure{{Peer: "p0", MbitS: -1}} }), "p1", ErrMalformed},
		{"negative compute", mutate(func(e *Envelope) { e.Heartbeat.ComputeUS = -3 }), "p1", ErrMalformed},
		{"negative rtt", mutate(func(e *Envelope) { e.Heartbeat.Links = []LinkFigure{{Peer: "p0", RTTMs: -0.5}} }), "p1", ErrMalformed},
		{"infinite throughput", []byte(`{"v":1,"cluster":"lab","type":"heartbeat","heartbeat":{"peer_id":"p1","version":"1",` +
			`"addrs":[],"devices":[],"seq":1,"step":0,"name":"","epoch":{"number":0,"order":null,"start_step":0,"coordinator":""},` +
			`"links":[{"peer":"p0","mbit_s":1e999,"rtt_ms":1}]}}`), "p1", ErrMalformed},
		{"shares of another length", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Shares = []float64{1} }), "p1", ErrMalformed},
		{"negative share", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Shares = []float64{1.5, -0.5} }), "p1", ErrMalformed},
		{"shares not summing to 1", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Shares = []float64{0.5, 0.4} }), "p1", ErrMalformed},
		{"schedule not a name", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Schedule = "Ring; drop" }), "p1", ErrMalformed},
		{"schedule too long", mutate(func(e *Envelope) { e.Heartbeat.Epoch.Schedule = strings.Repeat("a", maxScheduleLen+1) }), "p1", ErrMalformed},
		{"link codecs of another length", mutate(func(e *Envelope) {
			e.Heartbeat.Epoch.LinkCodecs, e.Heartbeat.Epoch.FinalCodec = []string{"fp16"}, "fp16"
		}), "p1", ErrMalformed},
		{"link codecs without final", mutate(func(e *Envelope) { e.Heartbeat.Epoch.LinkCodecs = []string{"fp16", "none"} }), "p1", ErrMalformed},
		{"final without link codecs", mutate(func(e *Envelope) { e.Heartbeat.Epoch.FinalCodec = "fp16" }), "p1", ErrMalformed},
		{"link codec not a spec", mutate(func(e *Envelope) {
			e.Heartbeat.Epoch.LinkCodecs, e.Heartbeat.Epoch.FinalCodec = []string{"fp16", "none\n"}, "fp16"
		}), "p1", ErrMalformed},
		{"link codec too long", mutate(func(e *Envelope) {
			e.Heartbeat.Epoch.LinkCodecs, e.Heartbeat.Epoch.FinalCodec = []string{"fp16", strings.Repeat("a", maxSpecLen+1)}, "fp16"
		}), "p1", ErrMalformed},
		{"epoch 0 with link codecs", mutate(func(e *Envelope) { e.Heartbeat.Epoch = Epoch{FinalCodec: "fp16"} }), "p1", ErrMalformed},
		{"epoch 0 with a schedule", mutate(func(e *Envelope) { e.Heartbeat.Epoch = Epoch{Schedule: "ring"} }), "p1", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.data, "lab", tt.author)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(validHeartbeat())
	f.Add(b)
	f.Add([]byte(`{"v":1,"cluster":"lab","type":"epoch","epoch":{"number":1,"order":["p1"],"coordinator":"p1"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data, "lab", "p1")
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to the same thing.
		b, err := Encode(env)
		if err != nil {
			t.Fatalf("accepted message does not re-encode: %v", err)
		}
		if _, err := Decode(b, "lab", "p1"); err != nil {
			t.Fatalf("re-encoded message rejected: %v", err)
		}
	})
}
