package config

import (
	"strings"
	"testing"
)

// TestValidateSwarmKeyMode: noise (the default) and pnet pass; anything
// else is reported under its key with both choices.
func TestValidateSwarmKeyMode(t *testing.T) {
	if m := DefaultConfig().Node.SwarmKeyMode; m != SwarmKeyNoise {
		t.Fatalf("default node.swarm_key_mode %q, want %q", m, SwarmKeyNoise)
	}
	for _, mode := range []string{SwarmKeyNoise, SwarmKeyPnet, "xsalsa", ""} {
		c := DefaultConfig()
		c.Node.SwarmKey, c.Node.SwarmKeyMode = "swarm.key", mode
		err := c.Validate()
		valid := mode == SwarmKeyNoise || mode == SwarmKeyPnet
		switch {
		case valid && err != nil:
			t.Errorf("mode %q: %v", mode, err)
		case !valid && (err == nil || !strings.Contains(err.Error(), "node.swarm_key_mode: \""+mode+"\" is not noise") ||
			!strings.Contains(err.Error(), "or pnet")):
			t.Errorf("mode %q: error %v, want one naming node.swarm_key_mode and both modes", mode, err)
		}
	}
}
