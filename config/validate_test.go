package config

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// validBase is the defaults on a loopback listen address: a configuration
// Validate accepts.
func validBase(t *testing.T) Config {
	t.Helper()
	c := DefaultConfig()
	c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults on loopback: %v", err)
	}
	return c
}

// floatKeys returns every float key of c with a pointer to its field, by
// the toml tags (as the file names them).
func floatKeys(c *Config) map[string]*float64 {
	keys := map[string]*float64{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if tag == "-" || !f.IsExported() {
				continue
			}
			switch fv := v.Field(i); fv.Kind() {
			case reflect.Struct:
				walk(fv, prefix+tag+".")
			case reflect.Float64:
				keys[prefix+tag] = fv.Addr().Interface().(*float64)
			case reflect.Float32:
				panic("a float32 key: extend floatKeys")
			}
		}
	}
	walk(reflect.ValueOf(c).Elem(), "")
	return keys
}

// TestFloatKeysRejectNonFinite: NaN and ±Inf (which TOML writes nan and
// inf) are refused for every float key, naming the key and its range.
func TestFloatKeysRejectNonFinite(t *testing.T) {
	if n := len(floatKeys(&Config{})); n < 9 {
		t.Fatalf("found %d float keys; the walk is broken", n)
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		for key := range floatKeys(&Config{}) {
			t.Run(fmt.Sprintf("%s=%g", key, v), func(t *testing.T) {
				c := validBase(t)
				*floatKeys(&c)[key] = v
				err := c.Validate()
				if want := fmt.Sprintf("%s: %g must be ", key, v); err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("Validate = %v, want an error containing %q", err, want)
				}
			})
		}
	}
	// The messages name the range.
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Train.Momentum = math.NaN() }, "train.momentum: NaN must be in [0, 1)"},
		{func(c *Config) { c.Train.WeightDecay = math.NaN() }, "train.weight_decay: NaN must be in [0, 1)"},
		{func(c *Config) { c.Train.ClipNorm = math.NaN() }, "train.clip_norm: NaN must be a finite number, at least 0 (0: off)"},
		{func(c *Config) { c.Train.ClipNorm = math.Inf(1) }, "train.clip_norm: +Inf must be a finite number, at least 0 (0: off)"},
		{func(c *Config) { c.Train.ClipNorm = -1 }, "train.clip_norm: -1 must be a finite number, at least 0 (0: off)"},
		{func(c *Config) { c.Allreduce.RobustTau = math.Inf(1) }, "allreduce.robust_tau: +Inf must be a positive number"},
	} {
		c := validBase(t)
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
		}
	}
}

// TestPeerCountsFitMaxPeers: keys that need more members than
// node.max_peers lets a peer connect to (itself and max_peers others) are
// refused naming both keys and their values.
func TestPeerCountsFitMaxPeers(t *testing.T) {
	gpt := func(c *Config) { c.Train.Model, c.Train.GPT.Layers = "gpt", 8 } // 11 layers
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string // nil when valid
	}{
		{"min peers at the limit", func(c *Config) { c.Train.MinPeers = 65 }, nil},
		{"two peers of one connection", func(c *Config) { c.Node.MaxPeers, c.Train.MinPeers = 1, 2 }, nil},
		{"min peers far above", func(c *Config) { c.Train.MinPeers = 100000 },
			[]string{"train.min_peers: 100000", "node.max_peers = 64", "at most 65 members"}},
		{"min peers one above", func(c *Config) { c.Node.MaxPeers, c.Train.MinPeers = 1, 3 },
			[]string{"train.min_peers: 3", "node.max_peers = 1"}},
		{"stages at the limit", func(c *Config) { gpt(c); c.Node.MaxPeers, c.Train.PipelineStages = 2, 3 }, nil},
		{"stages above", func(c *Config) { gpt(c); c.Node.MaxPeers, c.Train.PipelineStages = 2, 4 },
			[]string{"train.pipeline_stages: 4", "node.max_peers = 2"}},
		{"auto stages", func(c *Config) { gpt(c); c.Node.MaxPeers, c.Train.PipelineStages = 1, StagesAuto }, nil},
		{"max peers itself wrong", func(c *Config) { c.Node.MaxPeers = 0 }, []string{"node.max_peers: 0 is outside"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validBase(t)
			tc.edit(&c)
			err := c.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error saying %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if tc.name == "max peers itself wrong" && strings.Contains(err.Error(), "train.min_peers") {
				t.Errorf("error %q also blames train.min_peers", err)
			}
		})
	}
}

// TestAddressesAreValidated: node.api needs a numeric port and node.listen
// a plain TCP address, checked before the peer starts.
func TestAddressesAreValidated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(*Config)
		want   string // "" when valid
		reject string // a message the error must not hold
	}{
		{"api default", func(c *Config) {}, "", ""},
		{"api off", func(c *Config) { c.Node.API = "" }, "", ""},
		{"api port 0", func(c *Config) { c.Node.API = "127.0.0.1:0" }, "", ""},
		{"api localhost", func(c *Config) { c.Node.API = "localhost:7420" }, "", ""},
		{"api v6", func(c *Config) { c.Node.API = "[::1]:7420" }, "", ""},
		{"api public", func(c *Config) { c.Node.API, c.Node.APIPublic = ":7420", true }, "", ""},
		{"api port too big", func(c *Config) { c.Node.API = "127.0.0.1:99999" }, `node.api: "127.0.0.1:99999": port 99999 is not a number in 0..65535`, ""},
		{"api port negative", func(c *Config) { c.Node.API = ":-1" }, `node.api: ":-1": port -1 is not a number in 0..65535`, "loopback"},
		{"api port word", func(c *Config) { c.Node.API = ":abc" }, `node.api: ":abc": port abc is not a number in 0..65535`, "loopback"},
		{"api port service", func(c *Config) { c.Node.API = "127.0.0.1:http" }, `node.api: "127.0.0.1:http": port http is not`, ""},
		{"api port empty", func(c *Config) { c.Node.API = "127.0.0.1:" }, `node.api: "127.0.0.1:": port  is not`, ""},
		{"api no port", func(c *Config) { c.Node.API = "127.0.0.1" }, `node.api: "127.0.0.1" is not HOST:PORT`, ""},
		{"listen v6", func(c *Config) { c.Node.Listen = []string{"/ip6/::1/tcp/0"} }, "", ""},
		{"listen dns", func(c *Config) { c.Node.Listen = []string{"/dns4/localhost/tcp/0"} }, "", ""},
		{"listen port too big", func(c *Config) { c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/99999"} }, "node.listen[0]: invalid multiaddr", ""},
		{"listen udp", func(c *Config) { c.Node.Listen = []string{"/ip4/127.0.0.1/udp/1"} }, "node.listen[0]: \"/ip4/127.0.0.1/udp/1\" is not a TCP address", ""},
		{"listen ws", func(c *Config) { c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0/ws"} }, "node.listen[0]: \"/ip4/127.0.0.1/tcp/0/ws\" is not a plain TCP address", ""},
		{"listen p2p", func(c *Config) {
			c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"}
		}, "node.listen[0]: \"/ip4/127.0.0.1/tcp/0/p2p/", ""},
		{"listen tcp over udp", func(c *Config) { c.Node.Listen = []string{"/ip4/127.0.0.1/udp/1/tcp/2"} }, "node.listen[0]: \"/ip4/127.0.0.1/udp/1/tcp/2\" is not a plain TCP address", ""},
		{"listen two ports", func(c *Config) { c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/1/tcp/2"} }, "node.listen[0]: \"/ip4/127.0.0.1/tcp/1/tcp/2\" is not a plain TCP address", ""},
		{"announce p2p", func(c *Config) {
			c.Node.Announce = []string{"/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"}
		}, "node.announce[0]: \"/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN\" ends in /p2p/...", ""},
		{"announce dns", func(c *Config) { c.Node.Announce = []string{"/dns4/example.org/tcp/4001"} }, "", ""},
		{"api on the listen port", func(c *Config) {
			c.Node.API, c.Node.Listen = "127.0.0.1:4001", []string{"/ip4/0.0.0.0/tcp/4001"}
			c.Node.Open = true
		}, `node.api: "127.0.0.1:4001" takes the TCP port that node.listen's /ip4/0.0.0.0/tcp/4001 takes`, ""},
		{"api localhost on the listen port", func(c *Config) { c.Node.API, c.Node.Listen = "localhost:4001", []string{"/ip4/127.0.0.1/tcp/4001"} },
			`node.api: "localhost:4001" takes the TCP port`, ""},
		{"api on all addresses, the listen port", func(c *Config) {
			c.Node.API, c.Node.APIPublic, c.Node.Listen = ":4001", true, []string{"/ip4/127.0.0.1/tcp/4001"}
		}, `node.api: ":4001" takes the TCP port`, ""},
		{"api beside the listen port", func(c *Config) { c.Node.API, c.Node.Listen = "127.0.0.1:4001", []string{"/ip4/127.0.0.2/tcp/4001"} }, "", ""},
		{"api on another family", func(c *Config) { c.Node.API, c.Node.Listen = "[::1]:4001", []string{"/ip4/127.0.0.1/tcp/4001"} }, "", ""},
		{"api and listen on port 0", func(c *Config) { c.Node.API, c.Node.Listen = "127.0.0.1:0", []string{"/ip4/127.0.0.1/tcp/0"} }, "", ""},
		{"api on all addresses, listen on IPv6's", func(c *Config) {
			c.Node.API, c.Node.APIPublic, c.Node.Listen, c.Node.Open = "0.0.0.0:4001", true, []string{"/ip6/::/tcp/4001"}, true
		}, `node.api: "0.0.0.0:4001" takes the TCP port`, ""},
		{"api on all IPv6 addresses, listen on loopback", func(c *Config) {
			c.Node.API, c.Node.APIPublic, c.Node.Listen = "[::]:4001", true, []string{"/ip4/127.0.0.1/tcp/4001"}
		}, `node.api: "[::]:4001" takes the TCP port`, ""},
		{"api port with a leading zero", func(c *Config) { c.Node.API, c.Node.Listen = "127.0.0.1:04001", []string{"/ip4/127.0.0.1/tcp/4001"} },
			`node.api: "127.0.0.1:04001" takes the TCP port`, ""},
		{"listen on localhost by name", func(c *Config) { c.Node.API, c.Node.Listen = "127.0.0.1:4001", []string{"/dns4/localhost/tcp/4001"} },
			`node.api: "127.0.0.1:4001" takes the TCP port`, ""},
		{"api on IPv6 loopback, listen on IPv4's all", func(c *Config) {
			c.Node.API, c.Node.Listen, c.Node.Open = "[::1]:4001", []string{"/ip4/0.0.0.0/tcp/4001"}, true
		}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validBase(t)
			tc.edit(&c)
			err := c.Validate()
			wantValidate(t, err, tc.want)
			if tc.reject != "" && err != nil && strings.Contains(err.Error(), tc.reject) {
				t.Fatalf("Validate = %v, which should not say %q", err, tc.reject)
			}
		})
	}
}

// wantValidate checks Validate's err: nil when want is "", else an error
// containing want.
func wantValidate(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("Validate: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("Validate = %v, want an error containing %q", err, want)
	}
}
