package bridge

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"
)

// FuzzHello feeds arbitrary bytes to what a main hello goes through (the
// framing, the JSON, the layout and settings checks): an error, never a
// panic, and an accepted layout's sizes add up.
func FuzzHello(f *testing.F) {
	good, _ := json.Marshal(testLayout)
	f.Add(append(binary.LittleEndian.AppendUint32(nil, uint32(len(good))), good...))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{255, 255, 255, 255, '{'})
	f.Add(append(binary.LittleEndian.AppendUint32(nil, 60), `{"params":[{"name":"a","shape":[1e9,1e9],"dtype":"float32"}]}`...))
	f.Fuzz(func(t *testing.T, b []byte) {
		body, err := readMsg(bytes.NewReader(b))
		if err != nil {
			return
		}
		var h hello
		if decode(body, &h) != nil {
			return
		}
		lay, err := parseLayout(h.Params, h.Buckets)
		if err != nil {
			return
		}
		sum := 0
		for i, n := range lay.sizes {
			if lay.offsets[i] != sum {
				t.Fatalf("bucket %d at %d, want %d", i, lay.offsets[i], sum)
			}
			sum += n
		}
		if sum != lay.n || lay.n > maxValues {
			t.Fatalf("sizes add to %d, layout says %d", sum, lay.n)
		}
		settingsOf(lay, h.Settings)
	})
}
