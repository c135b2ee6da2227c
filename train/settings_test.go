package train

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

func testSettings(t *testing.T, edit func(*config.Train, *config.Allreduce)) Settings {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Train.Hidden = []int{8}
	if edit != nil {
		edit(&cfg.Train, &cfg.Allreduce)
	}
	m, err := model.New(cfg.Train.Model, model.Config{Hidden: cfg.Train.Hidden, MaxBatch: 4, Dropout: float32(cfg.Train.Dropout)}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	l := &ModelLearner{cfg: cfg.Train, m: m, devs: make([]gpu.Device, len(cfg.Train.Devices))}
	return settingsOf(cfg.Train, cfg.Allreduce, l)
}

// TestSettingsResumeHash: the checkpoint hash covers every key that
// changes what is computed (it once left out momentum, weight decay, clip
// norm, warm-up and sample limits), but not train.steps, so a run can be
// extended.
func TestSettingsResumeHash(t *testing.T) {
	base := testSettings(t, nil).resumeHash()
	for name, edit := range map[string]func(*config.Train, *config.Allreduce){
		"momentum":      func(c *config.Train, _ *config.Allreduce) { c.Momentum = 0.5 },
		"weight_decay":  func(c *config.Train, _ *config.Allreduce) { c.WeightDecay = 0.01 },
		"clip_norm":     func(c *config.Train, _ *config.Allreduce) { c.ClipNorm = 1 },
		"dropout":       func(c *config.Train, _ *config.Allreduce) { c.Dropout = 0.25 },
		"warmup_steps":  func(c *config.Train, _ *config.Allreduce) { c.WarmupSteps = 7 },
		"train_samples": func(c *config.Train, _ *config.Allreduce) { c.TrainSamples = 100 },
		"devices":       func(c *config.Train, _ *config.Allreduce) { c.Devices = []string{"cpu:0", "cpu:1"} },
		"hidden":        func(c *config.Train, _ *config.Allreduce) { c.Hidden = []int{9} },
		"lr":            func(c *config.Train, _ *config.Allreduce) { c.LR = 0.01 },
	} {
		if testSettings(t, edit).resumeHash() == base {
			t.Errorf("changing train.%s keeps the resume hash", name)
		}
	}
	for name, edit := range map[string]func(*config.Train, *config.Allreduce){
		"train.steps":     func(c *config.Train, _ *config.Allreduce) { c.Steps = 5000 },
		"allreduce.codec": func(_ *config.Train, a *config.Allreduce) { a.Codec = "sint8" },
	} {
		if testSettings(t, edit).resumeHash() != base {
			t.Errorf("changing %s refuses to resume", name)
		}
	}
}

func settingsMembers(held map[string]Settings) []gossip.Member {
	var out []gossip.Member
	for id, s := range held {
		out = append(out, gossip.Member{Heartbeat: gossip.Heartbeat{PeerID: id, App: Payload{Settings: s}.Encode()}})
	}
	return out
}

// TestCheckSettings: the settings most members hold win; the minority is
// told which key differs, the majority learns which members to exclude.
func TestCheckSettings(t *testing.T) {
	good := testSettings(t, nil).cluster()
	odd := testSettings(t, func(c *config.Train, _ *config.Allreduce) { c.Momentum = 0.5 }).cluster()
	ep := gossip.Epoch{Number: 4, Order: []string{"a", "b", "c"}, Coordinator: "a"}
	members := settingsMembers(map[string]Settings{"a": odd, "b": good, "c": good})
	_, err := checkSettings(odd, "a", members, ep)
	if !errors.Is(err, ErrSettingsDiffer) || !strings.Contains(err.Error(), "train.momentum = 0.5 here, 0.9 there") {
		t.Fatalf("minority (the coordinator): %v", err)
	}
	var se *SettingsError
	if !errors.As(err, &se) || !slices.Equal(se.Keys, []string{"train.momentum"}) || se.Holder != "b" {
		t.Fatalf("minority: %#v; want the key and b, a holder of the cluster's settings", err)
	}
	exclude, err := checkSettings(good, "b", members, ep)
	if err == nil || errors.Is(err, ErrSettingsDiffer) || !slices.Equal(exclude, []string{"a"}) {
		t.Fatalf("majority: %v, %v; want an error and a to exclude", err, exclude)
	}
	if !strings.Contains(err.Error(), "(a: train.momentum = 0.9 here, 0.5 there)") {
		t.Fatalf("majority: %v; want the key that differs named", err)
	}
	// A tie goes to the coordinator's settings.
	two := gossip.Epoch{Number: 5, Order: []string{"a", "b"}, Coordinator: "a"}
	_, err = checkSettings(good, "b", settingsMembers(map[string]Settings{"a": odd, "b": good}), two)
	if !errors.Is(err, ErrSettingsDiffer) || !strings.Contains(err.Error(), "1 of the epoch's 2 members, the coordinator's half: ties go to it") {
		t.Fatalf("tie, not the coordinator: %v", err)
	}
	if odd, err := checkSettings(good, "b", settingsMembers(map[string]Settings{"a": good, "b": good, "c": good}), ep); err != nil || odd != nil {
		t.Fatalf("equal settings: %v", err)
	}
	// Steps differ between peers: they would follow different learning-rate schedules.
	long := testSettings(t, func(c *config.Train, _ *config.Allreduce) { c.Steps = 99 }).cluster()
	if _, err := checkSettings(long, "b", settingsMembers(map[string]Settings{"a": good, "b": long}), two); !errors.Is(err, ErrSettingsDiffer) {
		t.Fatalf("train.steps differs: %v", err)
	}
}

// TestSettingsDiff: a key one side lacks is named as unknown there, and
// counts as empty, so both sides of a comparison agree whether the
// settings differ.
func TestSettingsDiff(t *testing.T) {
	got := Settings{"a": "1"}.diff(Settings{"a": "1", "b": "2"})
	if !slices.Equal(got, []string{"b = (unknown here), 2 there"}) {
		t.Errorf("a key only there: %q", got)
	}
	got = Settings{"a": "1", "b": "2"}.diff(Settings{"a": "1"})
	if !slices.Equal(got, []string{"b = 2 here, (unknown) there"}) {
		t.Errorf("a key only here: %q", got)
	}
	withEmpty, without := Settings{"a": "1", "b": ""}, Settings{"a": "1"}
	if !withEmpty.equal(without) || !without.equal(withEmpty) {
		t.Errorf("an empty value and a missing key: equal %v one way, %v the other", withEmpty.equal(without), without.equal(withEmpty))
	}
}
