package train

import (
	"errors"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
)

// TestModelLearnerRefusesImagesOfAnotherSize: images the model cannot
// take fail the learner's creation with ErrLearner, naming both sizes; a
// step on them failed and was retried for ever.
func TestModelLearnerRefusesImagesOfAnotherSize(t *testing.T) {
	small := func(n int) *data.Dataset {
		ds, err := data.NewDataset(&data.IDX{Dims: []int{n, 2, 2}, Data: make([]byte, 4*n)}, &data.IDX{Dims: []int{n}, Data: make([]byte, n)}, 10)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	cfg := config.DefaultConfig().Train
	cfg.Model, cfg.BatchSize = "mlp", 4
	l, err := NewModelLearner(cfg, 1<<20, small(8), small(4))
	if err == nil {
		l.Close()
	}
	if !errors.Is(err, ErrLearner) || !strings.Contains(err.Error(), "training images have 4 values each, mlp takes inputs of shape [784]") {
		t.Fatalf("err = %v", err)
	}
}
