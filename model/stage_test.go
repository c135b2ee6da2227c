package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// byName returns the tensors of v (m's Params or Grads) by tensor name.
func byName(m *Model, v []float32) map[string][]float32 {
	out := map[string][]float32{}
	for _, b := range m.Buckets() {
		for _, t := range b.Tensors {
			out[t.Name] = v[b.Offset+t.Offset : b.Offset+t.Offset+t.Len]
		}
	}
	return out
}

// wholeName maps a stage's tensor name to the whole model's: a head's copy
// of the token table is the embedding's table.
func wholeName(name string) string {
	if _, rest, ok := strings.Cut(name, ".tied_head("); ok && strings.HasSuffix(rest, ".wte") {
		return "0.embedding(v=32,t=8,d=16).wte"
	}
	return name
}

func newStage(t *testing.T, name string, cfg Config, lo, hi int) *Model {
	t.Helper()
	s, err := NewStage(name, cfg, gpu.NewCPU(0), 7, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestStagesInitialiseLikeTheWholeModel checks that every stage range of
// the gpt holds the whole model's tensors, under their names, with their
// initial values bit for bit, a head's copy of the token table included,
// and that TiedRange finds the shared table on both sides of a split.
func TestStagesInitialiseLikeTheWholeModel(t *testing.T) {
	cfg := Config{GPT: tinyGPT, MaxBatch: 2}
	whole := newGPT(t, tinyGPT, 2, 1, 7)
	want := byName(whole, whole.Params())
	infos, err := Layers("gpt", cfg)
	if err != nil {
		t.Fatal(err)
	}
	L := len(infos) // embedding, 2 blocks, final norm, head
	if L != 5 || infos[L-1].Tied != 0 || infos[L-1].TiedParams != 32*16 || infos[L-1].Params != 0 {
		t.Fatalf("layers %+v", infos)
	}
	total := 0
	for _, in := range infos {
		total += in.Params
	}
	if total != whole.NumParams() || infos[0].OutElems != 8*16 || infos[L-1].OutElems != 8*32 {
		t.Errorf("layer infos: %d params (model %d), embedding out %d, head out %d", total, whole.NumParams(), infos[0].OutElems, infos[L-1].OutElems)
	}
	for lo := 0; lo < L; lo++ {
		for hi := lo + 1; hi <= L; hi++ {
			s := newStage(t, "gpt", cfg, lo, hi)
			if a, b, n := s.StageRange(); a != lo || b != hi || n != L {
				t.Fatalf("StageRange = %d, %d, %d", a, b, n)
			}
			for name, v := range byName(s, s.Params()) {
				w, ok := want[wholeName(name)]
				if !ok || !slices.Equal(v, w) {
					t.Errorf("stage [%d, %d) tensor %s (found %v) differs from the whole model's", lo, hi, name, ok)
				}
			}
			off, n, ok := s.TiedRange()
			split := (lo == 0) != (hi == L) // the embedding and the head in different stages
			if ok != split || ok && (n != 32*16 || !slices.Equal(s.Params()[off:off+n], want["0.embedding(v=32,t=8,d=16).wte"])) {
				t.Errorf("stage [%d, %d): TiedRange = %d, %d, %v", lo, hi, off, n, ok)
			}
		}
	}
}

// TestStageChainMatchesWholeModel runs one batch through the gpt cut in
// three stages and through the whole model: the loss and every gradient
// but the shared token table's are bit-identical (the same operations on
// the same values), and the table's two parts add up to the whole model's
// gradient up to the order of the sum.
func TestStageChainMatchesWholeModel(t *testing.T) {
	cfg := Config{GPT: tinyGPT, MaxBatch: 3}
	whole := newGPT(t, tinyGPT, 3, 1, 7)
	perturb(whole, 5, 0.05)
	b := randomTokens(rand.New(rand.NewPCG(1, 2)), tinyGPT, 3)
	st, err := whole.ComputeGradients([]Batch{b}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantG := byName(whole, whole.Grads())
	cuts := []int{0, 2, 4, 5}
	var stages []*Model
	params := byName(whole, whole.Params())
	for i := range 3 {
		s := newStage(t, "gpt", cfg, cuts[i], cuts[i+1])
		for name, v := range byName(s, s.Params()) {
			copy(v, params[wholeName(name)])
		}
		s.SyncReplicas()
		stages = append(stages, s)
	}
	acts := [][]float32{b.X}
	var got Stats
	for i, s := range stages {
		var out []float32
		if i < 2 {
			out = make([]float32, 3*numel(s.StageOutputShape()))
		}
		if got, err = s.StageForward(StageInput{N: 3, X: acts[i], Y: b.Y, Train: true}, out); err != nil {
			t.Fatal(err)
		}
		acts = append(acts, out)
	}
	if got != st {
		t.Errorf("chained loss %+v, whole model %+v", got, st)
	}
	var dy []float32
	for i := 2; i >= 0; i-- {
		var dx []float32
		if i > 0 {
			dx = make([]float32, len(acts[i]))
		}
		if err := stages[i].StageBackward(dy, 1/float32(len(b.Y)), dx, false, nil); err != nil {
			t.Fatal(err)
		}
		dy = dx
	}
	table := "0.embedding(v=32,t=8,d=16).wte"
	sum := make([]float32, 32*16)
	for _, s := range stages {
		for name, g := range byName(s, s.Grads()) {
			w := wantG[wholeName(name)]
			if wholeName(name) == table {
				for j, v := range g {
					sum[j] += v
				}
				continue
			}
			if !slices.Equal(g, w) {
				t.Errorf("gradient of %s differs from the whole model's", name)
			}
		}
	}
	var diff, norm float64
	for j, v := range sum {
		diff += math.Pow(float64(v-wantG[table][j]), 2)
		norm += math.Pow(float64(wantG[table][j]), 2)
	}
	if math.Sqrt(diff/norm) > 1e-6 {
		t.Errorf("token table gradient: relative difference %g", math.Sqrt(diff/norm))
	}
}

// TestStageAccumulates checks that StageBackward with accumulate adds the
// micro-batch's gradient to Grads, and that ready sees every bucket in
// backward order.
func TestStageAccumulates(t *testing.T) {
	cfg := Config{Hidden: []int{8}, MaxBatch: 4}
	s := newStage(t, "mlp", cfg, 0, 3) // linear, relu, linear: the whole mlp
	rng := rand.New(rand.NewPCG(3, 3))
	x := make([]float32, 2*784)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	in := StageInput{N: 2, X: x, Y: []uint8{1, 7}, Train: true}
	if _, err := s.StageForward(in, nil); err != nil {
		t.Fatal(err)
	}
	var order []int
	if err := s.StageBackward(nil, 0.5, nil, false, func(k int) { order = append(order, k) }); err != nil {
		t.Fatal(err)
	}
	once := slices.Clone(s.Grads())
	if err := s.StageBackward(nil, 0.5, nil, true, nil); err != nil {
		t.Fatal(err)
	}
	for i, v := range s.Grads() {
		if v != 2*once[i] {
			t.Fatalf("accumulated gradient %d is %v, want 2 × %v", i, v, once[i])
		}
	}
	if len(order) != len(s.Buckets()) || !slices.IsSorted(order) {
		t.Errorf("ready order %v for %d buckets", order, len(s.Buckets()))
	}
}

// TestStageErrors checks that bad ranges and buffers are errors naming the
// problem, and that a stage refuses the whole-model API.
func TestStageErrors(t *testing.T) {
	cfg := Config{GPT: tinyGPT, MaxBatch: 2}
	for _, r := range [][2]int{{-1, 2}, {2, 2}, {3, 1}, {0, 6}} {
		if _, err := NewStage("gpt", cfg, gpu.NewCPU(0), 1, r[0], r[1]); err == nil || !strings.Contains(err.Error(), "not a non-empty range") {
			t.Errorf("range %v: %v", r, err)
		}
	}
	if _, err := NewStage("gpt", cfg, nil, 1, 0, 1); err == nil {
		t.Error("no device: no error")
	}
	mid := newStage(t, "gpt", cfg, 1, 3)
	if !slices.Equal(mid.StageInputShape(), []int{8, 16}) || !slices.Equal(mid.StageOutputShape(), []int{8, 16}) {
		t.Errorf("shapes %v → %v", mid.StageInputShape(), mid.StageOutputShape())
	}
	if _, err := mid.ComputeGradients([]Batch{{}}, 0, nil); err == nil || !strings.Contains(err.Error(), "StageForward") {
		t.Errorf("ComputeGradients on a stage: %v", err)
	}
	if err := mid.StageBackward(make([]float32, 128), 1, make([]float32, 128), false, nil); err == nil || !strings.Contains(err.Error(), "without a forward") {
		t.Errorf("backward first: %v", err)
	}
	act := make([]float32, 2*128)
	for _, tc := range []struct {
		in   StageInput
		out  int
		want string
	}{
		{StageInput{N: 3, X: make([]float32, 3*128)}, 3 * 128, "want 1..2"},
		{StageInput{N: 2, X: act[:100]}, 256, "input values"},
		{StageInput{N: 2, X: act}, 100, "output buffer"},
	} {
		if _, err := mid.StageForward(tc.in, make([]float32, tc.out)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.in.N, err, tc.want)
		}
	}
	if _, err := mid.StageForward(StageInput{N: 2, X: act, Train: true}, make([]float32, 256)); err != nil {
		t.Fatal(err)
	}
	if err := mid.StageBackward(make([]float32, 5), 1, act, false, nil); err == nil || !strings.Contains(err.Error(), "output gradient") {
		t.Errorf("short dy: %v", err)
	}
	if err := mid.StageBackward(act, 1, act[:7], false, nil); err == nil || !strings.Contains(err.Error(), "input gradient") {
		t.Errorf("short dx: %v", err)
	}
	last := newStage(t, "gpt", cfg, 3, 5)
	if _, err := last.StageForward(StageInput{N: 2, X: act, Y: make([]uint8, 3)}, nil); err == nil || !strings.Contains(err.Error(), "labels") {
		t.Errorf("short labels: %v", err)
	}
	if _, err := last.StageForward(StageInput{N: 2, X: act, Y: slices.Repeat([]uint8{40}, 16)}, nil); err == nil || !strings.Contains(err.Error(), "label 40") {
		t.Errorf("bad label: %v", err)
	}
	first := newStage(t, "gpt", cfg, 0, 2)
	if _, err := first.StageForward(StageInput{N: 1, X: slices.Repeat([]float32{0.5}, 8)}, make([]float32, 128)); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("bad token: %v", err)
	}
}

// TestProfileLayers checks that every layer gets a positive forward and
// backward time and that bad arguments are errors.
func TestProfileLayers(t *testing.T) {
	m := newGPT(t, tinyGPT, 2, 1, 1)
	b := randomTokens(rand.New(rand.NewPCG(1, 1)), tinyGPT, 2)
	ts, err := m.ProfileLayers(b, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 5 {
		t.Fatalf("%d layer times, want 5", len(ts))
	}
	for i, lt := range ts {
		if lt.Forward <= 0 || lt.Backward <= 0 {
			t.Errorf("layer %d: %+v", i, lt)
		}
	}
	if _, err := m.ProfileLayers(b, 0); err == nil {
		t.Error("0 repetitions: no error")
	}
	s := newStage(t, "gpt", Config{GPT: tinyGPT, MaxBatch: 2}, 0, 2)
	if _, err := s.ProfileLayers(b, 1); err == nil {
		t.Error("profiling a stage: no error")
	}
}
