package train

import (
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/plan"
)

// gptConfig is a tiny gpt on the Go standard library's strings package:
// steps steps of batch windows per peer.
func gptConfig(steps, peers, batch int, bootstrap ...string) config.Config {
	cfg := trainConfig(steps, peers, bootstrap...)
	cfg.Train.Model = "gpt"
	cfg.Train.Data = filepath.Join(runtime.GOROOT(), "src", "strings")
	cfg.Train.GPT = config.GPT{Layers: 2, DModel: 32, Heads: 2, Context: 32, Vocab: 256}
	cfg.Train.Optimizer, cfg.Train.LR = "adamw", 0.003
	cfg.Train.BatchSize = batch
	cfg.Train.EvalSamples = 64
	cfg.Allreduce.LinkCodecs = plan.LinkCodecsOff
	return cfg
}

// TestTrainGPTOneAndTwoPeersAgree: the language model trained by one peer
// with a global batch of 8 windows and by two peers with 4 each ends with
// the same held-out loss (only the order of floating-point sums differs:
// the global batch is the same windows), the two peers' replicas are
// identical, and the held-out loss falls well below the 8 bits per byte of
// a uniform guess.
func TestTrainGPTOneAndTwoPeersAgree(t *testing.T) {
	const steps = 60
	run := func(peers int) Result {
		var ps []*trainPeer
		for range peers {
			ps = append(ps, startTrainer(t, gptConfig(steps, peers, 8/peers, bootstrapTo(ps)...), nil))
		}
		for _, p := range ps {
			p.wait(t, 2*time.Minute)
		}
		return sameResult(t, ps, steps)
	}
	one, two := run(1), run(2)
	if one.BitsPerByte <= 0 || one.BitsPerByte > 6 {
		t.Fatalf("1 peer: %.3f bits per byte after %d steps, want well below 8 (and above 0)", one.BitsPerByte, steps)
	}
	if d := math.Abs(one.Loss - two.Loss); d > 1e-3*one.Loss {
		t.Fatalf("held-out loss %.6f with 1 peer, %.6f with 2: the same global batch should give the same curve", one.Loss, two.Loss)
	}
	t.Logf("held-out bits per byte after %d steps: 1 peer %.4f, 2 peers %.4f (loss %.6f / %.6f)", steps, one.BitsPerByte, two.BitsPerByte, one.Loss, two.Loss)
}

// TestTrainGPTRefusesMissingData: a train.data that does not exist, or a
// directory without files of the train.data_ext endings, is refused by
// name, wrapping data.ErrNoText (p2ptrain exits 2).
func TestTrainGPTRefusesMissingData(t *testing.T) {
	for _, path := range []string{filepath.Join(t.TempDir(), "missing"), t.TempDir()} {
		cfg := gptConfig(10, 1, 4)
		cfg.Train.Data = path
		_, err := NewModelLearner(cfg.Train, cfg.Allreduce.BucketBytes, nil, nil)
		if err == nil || !errors.Is(err, data.ErrNoText) || !containsAll(err.Error(), "train.data", path) {
			t.Errorf("train.data %s: %v, want data.ErrNoText naming it", path, err)
		}
	}
}
