package train

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
)

// viewCluster is a Cluster whose View lists members; nothing else is used.
type viewCluster struct {
	Cluster
	members []gossip.Member
}

func (c viewCluster) View() ([]gossip.Member, gossip.Epoch) { return c.members, gossip.Epoch{} }

// TestCheckStateComparesTheStagesCheck: a state fetched from a member
// must match the parameter hash that member gossiped for that step and
// that stage. A member that moved to stage 1 at step 70 gossips stage 1's
// hash and serves the stage 0 it left: its stage-0 state is taken; a
// stage-0 state that differs from a stage-0 hash it gossiped is refused.
func TestCheckStateComparesTheStagesCheck(t *testing.T) {
	ck := &model.Checkpoint{Step: 70, Params: model.FloatBytes([]float32{1, 2, 3})}
	sum := sha256.Sum256(ck.Params)
	hash := hex.EncodeToString(sum[:])
	gossiped := func(stage int, h string) []gossip.Member {
		return []gossip.Member{{Heartbeat: gossip.Heartbeat{PeerID: "src", App: Payload{Check: &ParamCheck{Step: 70, Hash: h, Stage: stage}}.Encode()}}}
	}
	tr := &Trainer{wantStage: 0}
	ck.ConfigHash = tr.stateHash(0)
	tr.c = viewCluster{members: gossiped(1, "another stage's hash")}
	if _, got, err := tr.checkState("src", 70, "", ck.Marshal()); err != nil || got != hash {
		t.Fatalf("stage 0's state from a member that gossips stage 1's hash: %v", err)
	}
	tr.c = viewCluster{members: gossiped(0, "another hash")}
	if _, _, err := tr.checkState("src", 70, "", ck.Marshal()); err == nil || !strings.Contains(err.Error(), "it announced") {
		t.Fatalf("a state that differs from the hash its server gossiped for the stage: %v", err)
	}
}
