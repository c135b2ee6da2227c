package train

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
)

// Settings are the configuration keys that decide what the cluster
// computes, by key (train.lr, allreduce.codec, ...), each value in a
// canonical text form. Peers announce them in their payload and refuse to
// train with peers whose settings differ.
type Settings map[string]string

// clusterOnly are the keys that must agree between peers but not between
// a checkpoint and the run resuming it: extending a run (train.steps
// higher) resumes it; codecs carry no state across a restart.
// train.pipeline_stages too: a checkpoint of pipeline stages cannot be
// resumed (config refuses train.checkpoint_dir with them), and a run of
// one stage resumes the checkpoints written before the key was compared.
var clusterOnly = []string{"train.steps", "allreduce.codec", "allreduce.bucket_bytes", "allreduce.robust", "train.pipeline_stages"}

// localOnly are the keys that must agree between a checkpoint and the run
// resuming it but may differ between peers: each peer's devices take
// their own share of the global batch.
var localOnly = []string{"train.devices"}

// settingsOf returns the settings of a trainer of learner l: the
// learner's and the trainer's own (the run's length, the codecs, the
// shared seed).
func settingsOf(cfg config.Train, ar config.Allreduce, l Learner) Settings {
	s := Settings{
		"train.trainer":              cfg.Trainer,
		"train.warmup_steps":         strconv.Itoa(cfg.WarmupSteps),
		"train.lowrank_warmup_steps": strconv.Itoa(cfg.LowRankWarmupSteps),
		"train.seed":                 strconv.FormatUint(cfg.Seed, 10),
		"train.steps":                strconv.Itoa(cfg.Steps),
		"allreduce.codec":            ar.Codec,
		"allreduce.bucket_bytes":     strconv.Itoa(ar.BucketBytes),
		"allreduce.robust":           ar.RobustSpec(),
		"train.pipeline_stages":      cfg.PipelineStages.String(),
	}
	for k, v := range l.Settings() {
		s[k] = v
	}
	return s
}

// cluster returns the settings peers must agree on.
func (s Settings) cluster() Settings {
	out := Settings{}
	for k, v := range s {
		if !slices.Contains(localOnly, k) {
			out[k] = v
		}
	}
	return out
}

// resumeHash identifies the settings a checkpoint may be resumed under.
func (s Settings) resumeHash() [32]byte {
	keys := make([]string, 0, len(s))
	for k := range s {
		if !slices.Contains(clusterOnly, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	parts := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		parts = append(parts, k, s[k])
	}
	return model.ConfigHash(parts...)
}

// diff lists the keys whose values differ between s and o, as
// "key = mine here, theirs there", sorted by key.
func (s Settings) diff(o Settings) []string {
	var out []string
	for _, k := range s.differing(o) {
		switch v, ok := s[k]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s = (unknown here), %s there", k, o[k]))
		default:
			w, ok := o[k]
			if !ok {
				w = "(unknown)"
			}
			out = append(out, fmt.Sprintf("%s = %s here, %s there", k, v, w))
		}
	}
	return out
}

// differing returns the keys whose values differ between s and o, sorted;
// a key one of them lacks counts as empty there (so that both sides of a
// comparison agree whether they differ).
func (s Settings) differing(o Settings) []string {
	var keys []string
	for k, v := range s {
		if o[k] != v {
			keys = append(keys, k)
		}
	}
	for k, w := range o {
		if _, ok := s[k]; !ok && w != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func (s Settings) equal(o Settings) bool { return len(s.diff(o)) == 0 }

// ErrSettingsDiffer: this peer's training settings are not the cluster's (its error names the keys).
var ErrSettingsDiffer = errors.New("train: this peer's training settings differ from the cluster's")

// SettingsError is the error of a peer whose settings are not the
// cluster's; errors.Is(err, ErrSettingsDiffer) holds for it.
type SettingsError struct {
	// Keys are the keys whose values differ, sorted.
	Keys []string
	// Holder is a member that holds the cluster's settings, to ask for more
	// about them (an external trainer's layout: node.Node.FetchLayout), and
	// Cluster are those settings.
	Holder  string
	Cluster Settings
	msg     string
}

func (e *SettingsError) Error() string { return e.msg }

// Unwrap returns ErrSettingsDiffer.
func (e *SettingsError) Unwrap() error { return ErrSettingsDiffer }

// checkSettings compares the settings every member of ep announced. The
// settings most members hold win (ties: the coordinator's). A peer in the
// minority gets a *SettingsError that names the keys; a
// peer in the majority gets a plain error and the peers that differ (it
// excludes them: they run another job).
func checkSettings(mine Settings, self string, members []gossip.Member, ep gossip.Epoch) (odd []string, err error) {
	held := map[string]Settings{self: mine}
	for _, m := range members {
		if m.PeerID != self && slices.Contains(ep.Order, m.PeerID) {
			held[m.PeerID] = payloadOf(m).Settings
		}
	}
	support := func(s Settings) int {
		n := 0
		for _, p := range ep.Order {
			if held[p] != nil && held[p].equal(s) {
				n++
			}
		}
		return n
	}
	var best Settings
	bestN, holder := -1, ""
	for _, p := range append([]string{ep.Coordinator}, ep.Order...) {
		if s := held[p]; s != nil {
			if n := support(s); n > bestN {
				best, bestN, holder = s, n, p
			}
		}
	}
	if best == nil || mine.equal(best) {
		for _, p := range ep.Order {
			if held[p] == nil || !held[p].equal(mine) {
				odd = append(odd, p)
			}
		}
		if len(odd) == 0 {
			return nil, nil
		}
		var why string
		if o := held[odd[0]]; o != nil {
			why = fmt.Sprintf(" (%s: %s)", odd[0], strings.Join(mine.diff(o), "; "))
		}
		return odd, fmt.Errorf("train: members %s announce other training settings%s; training without them", strings.Join(odd, ", "), why)
	}
	return nil, &SettingsError{Keys: mine.differing(best), Holder: holder, Cluster: best,
		msg: fmt.Sprintf("%v (the cluster's are held by %d of the epoch's %d members%s): %s", ErrSettingsDiffer, bestN, len(ep.Order), tieNote(bestN, len(ep.Order)), strings.Join(mine.diff(best), "; "))}
}

// tieNote explains, for a settings conflict that n of w members decided,
// why a half prevails: ties go to the coordinator's settings.
func tieNote(n, w int) string {
	if 2*n == w {
		return ", the coordinator's half: ties go to it"
	}
	return ""
}
