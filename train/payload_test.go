package train

import (
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gossip"
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
