package train

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/internal/finite"
)

// TestReadyNamesEpochByContent: two rings adopted under one epoch number
// are different epochs; a Ready announced in one does not count in the
// other (it once did, by number alone).
func TestReadyNamesEpochByContent(t *testing.T) {
	a := gossip.Epoch{Number: 7, Order: []string{"p", "q"}, Coordinator: "p"}
	b := gossip.Epoch{Number: 7, Order: []string{"p", "r"}, Coordinator: "p"}
	r := &Ready{Epoch: a.Number, Digest: a.Digest(), Step: 3}
	if !r.In(a) || r.In(b) || sameEpoch(a, b) || !sameEpoch(a, a) {
		t.Fatalf("ready %+v: in a %v, in b %v; same epoch %v", r, r.In(a), r.In(b), sameEpoch(a, b))
	}
	var none *Ready
	if none.In(a) {
		t.Fatal("a nil Ready counts")
	}
}

// TestDecodePayload: a payload round-trips, and malformed or foreign ones
// are errors that say what is wrong.
func TestDecodePayload(t *testing.T) {
	p := Payload{Ready: &Ready{Epoch: 1, Digest: "ab", Step: 2}, Check: &ParamCheck{Step: 2, Hash: "ff"}, Devices: []string{"cpu:0"}}
	got, err := DecodePayload(p.Encode())
	if err != nil || got.Ready.Step != 2 || got.Check.Hash != "ff" || got.V != payloadVersion {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if got, err := DecodePayload(nil); err != nil || got.Ready != nil {
		t.Fatalf("empty payload: %+v, %v", got, err)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"v":2}`, "version 2"},
		{`{"v":1,"check":{"step":1,"hash":""}}`, "parameter hash"},
		{`not json`, "payload"},
		{`{"v":1,"devices":[` + strings.Repeat(`"x",`, maxDevices) + `"x"]}`, "devices"},
	} {
		if _, err := DecodePayload([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one mentioning %q", tc.in, err, tc.want)
		}
	}
}

// TestChooseState: members continue from the state most of them announce,
// counting only members past step 0; one member claiming a far higher step
// does not outvote the rest (every honest peer once adopted such a
// member's state, NaN included).
func TestChooseState(t *testing.T) {
	type st struct {
		step uint64
		hash string
	}
	for _, tc := range []struct {
		name    string
		members map[string]st
		step    uint64
		hash    string
	}{
		{"a liar with a higher step", map[string]st{"a": {100, "H"}, "b": {100, "H"}, "x": {1 << 40, "NaN"}}, 100, "H"},
		{"joiners follow the trained peer", map[string]st{"a": {100, "H"}, "j1": {0, "I"}, "j2": {0, "I"}}, 100, "H"},
		{"a fresh cluster", map[string]st{"a": {0, "I"}, "b": {0, "I"}}, 0, ""},
		{"a diverged peer", map[string]st{"a": {50, "H"}, "b": {50, "H"}, "c": {50, "D"}}, 50, "H"},
		{"a one-to-one tie goes to the higher step", map[string]st{"a": {50, "H"}, "b": {60, "K"}}, 60, "K"},
		{"the majority's lineage, not the higher step", map[string]st{"a": {200, "M"}, "b": {200, "M"}, "c": {300, "m"}}, 200, "M"},
		{"a claim beyond train.steps", map[string]st{"a": {0, "I"}, "x": {1 << 40, "NaN"}}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var order []string
			steps, hashes := map[string]uint64{}, map[string]string{}
			for p, s := range tc.members {
				order = append(order, p)
				steps[p], hashes[p] = s.step, s.hash
			}
			step, hash := chooseState(order, steps, hashes, 1000)
			if step != tc.step || hash != tc.hash {
				t.Fatalf("chooseState = %d %q, want %d %q", step, hash, tc.step, tc.hash)
			}
		})
	}
}

// TestFirstNonFinite: a downloaded state with a NaN or ±Inf parameter is
// found (and refused by syncFrom).
func TestFirstNonFinite(t *testing.T) {
	vals := []float32{1, -2, 3.5, 0}
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	if i := finite.FirstInBytes(b); i != -1 {
		t.Fatalf("finite values: index %d", i)
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		binary.LittleEndian.PutUint32(b[8:], math.Float32bits(bad))
		if i := finite.FirstInBytes(b); i != 2 {
			t.Fatalf("%v at index 2: got %d", bad, i)
		}
	}
}

// TestMajorityBehindAFinishedPeer: a peer that completed the last step
// while the round failed for the others trains it again with them when
// they are the epoch's majority, and not when it is not outvoted or not
// every member has announced its Ready yet.
func TestMajorityBehindAFinishedPeer(t *testing.T) {
	type st struct {
		id   string
		step uint64
		hash string
	}
	for _, tc := range []struct {
		name   string
		others []st // members besides "a", which finished step 60 with hash F
		ready  int  // how many of them announced their Ready
		want   bool
	}{
		{"two members a step behind", []st{{"b", 59, "E"}, {"j", 59, "E"}}, 2, true},
		{"one member behind, one finished", []st{{"b", 59, "E"}, {"j", 60, "F"}}, 2, false},
		{"every member finished", []st{{"b", 60, "F"}, {"j", 60, "F"}}, 2, false},
		{"a member not ready yet", []st{{"b", 59, "E"}, {"j", 59, "E"}}, 1, false},
		{"a lone member behind (a tie goes to the higher step)", []st{{"b", 59, "E"}}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := gossip.Epoch{Number: 5, Order: []string{"a"}, Coordinator: "a"}
			for _, o := range tc.others {
				ep.Order = append(ep.Order, o.id)
			}
			var members []gossip.Member
			for _, o := range tc.others[:tc.ready] {
				p := Payload{Ready: &Ready{Epoch: ep.Number, Digest: ep.Digest(), Step: o.step, Hash: o.hash}}
				members = append(members, gossip.Member{Heartbeat: gossip.Heartbeat{PeerID: o.id, App: p.Encode(), Step: o.step}, State: gossip.Alive})
			}
			own := &Ready{Epoch: ep.Number, Digest: ep.Digest(), Step: 60, Hash: "F"}
			if got := majorityBehind(ep, members, "a", own, 60); got != tc.want {
				t.Fatalf("majorityBehind = %v, want %v", got, tc.want)
			}
		})
	}
}
