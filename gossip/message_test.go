package gossip

import (
	"errors"
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
