package config

import (
	"strings"
	"testing"
)

// TestPipelineKeysAreValidated: the pipeline keys accept what a pipeline
// runs and name the key and the reason for everything else, including the
// keys a pipeline of several stages cannot run with yet.
func TestPipelineKeysAreValidated(t *testing.T) {
	gpt := func(c *Config) {
		c.Train.Model = "gpt"
		c.Train.GPT.Layers = 2 // 5 layers
		c.Train.PipelineStages = 2
	}
	ok := []func(*Config){
		func(*Config) {}, // the defaults: pure data parallelism
		gpt,
		func(c *Config) {
			gpt(c)
			c.Train.PipelineStages = 5
			c.Train.PipelineSchedule = "gpipe"
			c.Train.ActivationCodec = "none"
		},
		func(c *Config) { c.Train.PipelineStages = 3; c.Train.Hidden = []int{64, 64} }, // the mlp: 3 layers
		func(c *Config) { gpt(c); c.Train.PipelineStages = StagesAuto },
		func(c *Config) {
			gpt(c)
			c.Train.PipelineStages = 2
			c.Train.ActivationLinkCodecs = ActivationLinkCodecsAuto
		},
		func(c *Config) { gpt(c); c.Train.PipelineSplit = []int{0, 4, 5} }, // a cut of p2ptrain plan's
		func(c *Config) { gpt(c); c.Train.PipelineStages = 3; c.Train.PipelineSplit = []int{0, 1, 2, 5} },
		// auto: micro-batches above batch_size only rule out the layouts
		// whose pipelines (S × batch_size samples) cannot hold them.
		func(c *Config) {
			gpt(c)
			c.Train.PipelineStages, c.Train.BatchSize, c.Train.MicroBatches = StagesAuto, 4, 8
		},
	}
	base := func() Config {
		c := DefaultConfig()
		c.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		return c
	}
	for i, edit := range ok {
		c := base()
		edit(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("valid configuration %d refused: %v", i, err)
		}
	}
	for _, tc := range []struct {
		edit func(*Config)
		want []string
	}{
		{func(c *Config) { gpt(c); c.Train.PipelineStages = 6 }, []string{"train.pipeline_stages", "6 stages", "gpt has 5"}},
		{func(c *Config) { c.Train.PipelineStages = 0 }, []string{"train.pipeline_stages", "[1, 256]", "auto"}},
		{func(c *Config) { c.Train.PipelineStages = -1 }, []string{"train.pipeline_stages", "-1 must be"}},
		{func(c *Config) { gpt(c); c.Train.PipelineStages = StagesAuto; c.Train.ClipNorm = 1 }, []string{"train.clip_norm", "pipeline_stages = auto"}},
		{func(c *Config) { gpt(c); c.Train.PipelineStages = StagesAuto; c.Allreduce.Codec = "powersgd:rank=4" }, []string{"allreduce.codec", "pipeline_stages = auto", "low-rank"}},
		{func(c *Config) { c.Train.PipelineSchedule = "zigzag" }, []string{"train.pipeline_schedule", "zigzag"}},
		{func(c *Config) { c.Train.ActivationCodec = "powersgd:rank=4" }, []string{"train.activation_codec", "linear or quantized"}},
		{func(c *Config) { c.Train.ActivationLinkCodecs = "on" }, []string{"train.activation_link_codecs", `"on" is not "off" or "auto"`}},
		{func(c *Config) { c.Train.MicroBatches = 0 }, []string{"train.micro_batches", "at least 1"}},
		{func(c *Config) { gpt(c); c.Train.BatchSize, c.Train.MicroBatches = 4, 8 }, []string{"train.micro_batches", "train.batch_size (4)"}},
		{func(c *Config) { gpt(c); c.Train.SyncEvery, c.Train.Steps = 2, 10 }, []string{"train.sync_every", "DiLoCo"}},
		{func(c *Config) { gpt(c); c.Train.Devices = []string{"cpu:0", "cpu:1"} }, []string{"train.devices", "one device"}},
		{func(c *Config) { gpt(c); c.Train.ClipNorm = 1 }, []string{"train.clip_norm", "global gradient norm"}},
		{func(c *Config) { gpt(c); c.Train.CheckpointDir = t.TempDir() }, []string{"train.checkpoint_dir", "pipeline_stages = 2"}},
		{func(c *Config) { gpt(c); c.Train.Trainer = TrainerExternal }, []string{"train.trainer", "built-in"}},
		{func(c *Config) { gpt(c); c.Train.PipelineSplit = []int{0, 2, 4, 5} }, []string{"train.pipeline_split", "has 4 boundaries", "pipeline_stages = 2 needs 3"}},
		{func(c *Config) { gpt(c); c.Train.PipelineSplit = []int{0, 6} }, []string{"train.pipeline_split", "has 2 boundaries"}},
		{func(c *Config) { gpt(c); c.Train.PipelineSplit = []int{0, 3, 6} }, []string{"train.pipeline_split", "gpt has 5 layers", "does not cover 5"}},
		{func(c *Config) { gpt(c); c.Train.PipelineSplit = []int{1, 3, 5} }, []string{"train.pipeline_split", "does not cover"}},
		{func(c *Config) { gpt(c); c.Train.PipelineSplit = []int{0, 0, 5} }, []string{"train.pipeline_split", "empty stage 0"}},
		{func(c *Config) { gpt(c); c.Train.PipelineStages = StagesAuto; c.Train.PipelineSplit = []int{0, 3, 5} },
			[]string{"train.pipeline_split", "fixed train.pipeline_stages", "auto"}},
		{func(c *Config) { c.Train.PipelineSplit = []int{0, 2} }, []string{"train.pipeline_split", "not 1"}},
	} {
		c := base()
		tc.edit(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%+v accepted; want an error naming %v", c.Train, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
	}
}

// TestStagesText: train.pipeline_stages reads an integer or "auto" and
// writes them back; any other text is refused naming the key.
func TestStagesText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Stages
	}{{"auto", StagesAuto}, {"2", 2}, {"1", 1}, {"0", 0}} {
		var s Stages
		if err := s.UnmarshalText([]byte(tc.in)); err != nil || s != tc.want {
			t.Errorf("%q: %v, %v; want %v", tc.in, s, err, tc.want)
		}
		if b, _ := s.MarshalText(); string(b) != tc.in {
			t.Errorf("%v writes %q, want %q", s, b, tc.in)
		}
	}
	for _, in := range []string{"fast", "Auto", "2.5", "", "-2147483648"} {
		var s Stages
		if err := s.UnmarshalText([]byte(in)); err == nil || !strings.Contains(err.Error(), "train.pipeline_stages") {
			t.Errorf("%q: %v, %v; want an error naming train.pipeline_stages", in, s, err)
		}
	}
}
