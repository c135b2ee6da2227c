package node

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// orderedIdentities writes n identity files drawn from a seeded generator
// and returns their paths sorted by peer ID, with the IDs.
func orderedIdentities(t *testing.T, n int, seed uint64) ([]string, []peer.ID) {
	t.Helper()
	src := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	type ident struct {
		path string
		id   peer.ID
	}
	var out []ident
	for i := range n {
		priv, _, err := crypto.GenerateEd25519Key(src)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPrivateKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		b, err := crypto.MarshalPrivateKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), fmt.Sprintf("k%d.key", i))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out = append(out, ident{path, id})
	}
	slices.SortFunc(out, func(a, b ident) int { return strings.Compare(a.id.String(), b.id.String()) })
	paths, ids := make([]string, n), make([]peer.ID, n)
	for i, x := range out {
		paths[i], ids[i] = x.path, x.id
	}
	return paths, ids
}

// TestSurvivorResumesWithANewcomerOfHigherID: of a ring of two that
// trained, one member is killed; the survivor, 1 of 2, must not go on alone.
// A newcomer whose peer ID sorts after the survivor's then joins through
// the survivor, and the two form a ring. (They never did: the survivor, the
// coordinator, counted 1 of the 2 members of its ring and proposed nothing,
// and the newcomer followed it. With a newcomer of lower ID, which proposed
// itself, they did.)
func TestSurvivorResumesWithANewcomerOfHigherID(t *testing.T) {
	// As in the report: the survivor has the lowest ID, the newcomer the highest.
	survivorResumes(t, 0, 1, 2)
}

// TestSurvivorResumesWithANewcomerOfLowerID: the same with a newcomer whose
// peer ID sorts first. It coordinates and proposes the ring of the two of
// them, with no ring of its own to count; the survivor adopts it by its own
// count of the quorum (2 of 3: its ring of two and the newcomer), which a
// member now checks for every epoch another proposes.
func TestSurvivorResumesWithANewcomerOfLowerID(t *testing.T) {
	survivorResumes(t, 1, 2, 0)
}

// survivorResumes runs a ring of two that trained, of the identities
// survivor and victim (indexes in peer-ID order), kills the victim, checks
// that the survivor waits, and starts a newcomer of identity newcomer,
// with which the survivor must form a ring.
func survivorResumes(t *testing.T, survivorKey, victimKey, newcomerKey int) {
	t.Helper()
	keys, ids := orderedIdentities(t, 3, 8)
	survivorCfg := testConfig()
	survivorCfg.Node.Identity = keys[survivorKey]
	survivor := startNode(t, survivorCfg, nil)
	boot := survivor.AddrStrings()[0]
	victimCfg := testConfig(boot)
	victimCfg.Node.Identity = keys[victimKey]
	victim := startNode(t, victimCfg, nil)
	if survivor.ID() != ids[survivorKey] || victim.ID() != ids[victimKey] {
		t.Fatalf("identities not used: %s %s", survivor.ID(), victim.ID())
	}
	eventually(t, 15*time.Second, "the pair agrees", func() error {
		return agreeOn([]*Node{survivor, victim}, []peer.ID{survivor.ID(), victim.ID()})
	})
	_, trained := survivor.Gossip().Snapshot()
	survivor.Gossip().Commit(trained.Number)
	victim.Gossip().Commit(trained.Number)

	if err := victim.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	eventually(t, testFailAfter+10*testHeartbeat, "the survivor waits for a quorum", func() error {
		if st := stateOn(survivor, victim.ID()); st != gossip.Dead {
			return fmt.Errorf("the killed peer is %v", st)
		}
		if w := survivor.Gossip().Stats().Waiting; !strings.Contains(w, "no quorum: 1 of the 2 members") {
			return fmt.Errorf("waiting %q", w)
		}
		return nil
	})
	if _, e := survivor.Gossip().Snapshot(); len(e.Order) < 2 {
		t.Fatalf("the survivor went on alone in epoch %d %v", e.Number, e.Order)
	}

	newcomerCfg := testConfig(boot)
	newcomerCfg.Node.Identity = keys[newcomerKey]
	newcomer := startNode(t, newcomerCfg, nil)
	took := eventually(t, 10*time.Second, "the survivor and the newcomer form a ring", func() error {
		return agreeOn([]*Node{survivor, newcomer}, []peer.ID{survivor.ID(), newcomer.ID()})
	})
	t.Logf("ring re-formed %s after the newcomer started", took)
	if w := survivor.Gossip().Stats().Waiting; w != "" {
		t.Fatalf("the survivor still waits: %q", w)
	}
	if _, e := survivor.Gossip().Snapshot(); e.Coordinator != slices.Min([]string{survivor.ID().String(), newcomer.ID().String()}) {
		t.Fatalf("epoch %d proposed by %s, want the lower ID of the two", e.Number, e.Coordinator)
	}
}
