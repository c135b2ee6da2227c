package pipeline

import (
	"fmt"
	"slices"

	"github.com/p2ptrain/p2ptrain/model"
)

// Assignment arranges the members of a ring epoch into S stages × R
// replicas (a Layout is the projection of one such arrangement). Every
// member computes it from the epoch's order alone, so all agree.
//
// The rule: R = ⌊P/S⌋ for P members; pipeline r is the S consecutive
// members order[r·S : (r+1)·S], stage s of it at order[r·S+s]. The ring
// planner puts fast links between neighbours of the order, so consecutive
// stages, which exchange activations every micro-batch, sit on them.
// Stage s's R replicas, which all-reduce that stage's gradients, are the
// members at positions s, s+S, s+2S, … The last P mod S members are idle
// in the epoch: they hold no stage and wait for the next epoch.
type Assignment struct {
	// Stages and Replicas are S and R.
	Stages, Replicas int
	// Pipelines[r][s] is replica r's member at stage s.
	Pipelines [][]string
	// Idle are the members left over.
	Idle []string
}

// Assign lays out order (a ring epoch's members, in ring order) in
// stages stages.
func Assign(order []string, stages int) (Assignment, error) {
	if stages < 1 {
		return Assignment{}, fmt.Errorf("pipeline: %d stages", stages)
	}
	if len(order) < stages {
		return Assignment{}, fmt.Errorf("pipeline: %d members cannot hold %d stages (train.pipeline_stages): a pipeline needs a member per stage", len(order), stages)
	}
	r := len(order) / stages
	l := Assignment{Stages: stages, Replicas: r, Idle: slices.Clone(order[r*stages:])}
	for i := range r {
		l.Pipelines = append(l.Pipelines, slices.Clone(order[i*stages:(i+1)*stages]))
	}
	return l, nil
}

// Place returns member p's stage and replica, and false when p is idle or
// not a member.
func (l Assignment) Place(p string) (stage, replica int, ok bool) {
	for r, pl := range l.Pipelines {
		if s := slices.Index(pl, p); s >= 0 {
			return s, r, true
		}
	}
	return 0, 0, false
}

// StageMembers returns the members that hold stage s, in replica order: the
// ring that all-reduces the stage's gradients.
func (l Assignment) StageMembers(s int) []string {
	out := make([]string, 0, l.Replicas)
	for _, pl := range l.Pipelines {
		out = append(out, pl[s])
	}
	return out
}

// String formats the layout for logs: "2×2 [a b] [c d] idle [e]".
func (l Assignment) String() string {
	s := fmt.Sprintf("%d×%d", l.Stages, l.Replicas)
	for _, pl := range l.Pipelines {
		s += fmt.Sprint(" ", pl)
	}
	if len(l.Idle) > 0 {
		s += fmt.Sprint(" idle ", l.Idle)
	}
	return s
}

// ParamCosts weighs each layer by its parameters, a tied layer counting
// the weight it shares (the gpt's head multiplies by the token table): a
// proxy for compute that every peer computes alike from the configuration,
// where measured times differ between peers. Balance over it gives the
// split every member of a cluster uses.
func ParamCosts(layers []model.LayerInfo) []float64 {
	costs := make([]float64, len(layers))
	for i, l := range layers {
		costs[i] = float64(l.Params + l.TiedParams)
	}
	return costs
}
