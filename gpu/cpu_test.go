package gpu_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/devicetest"
)

func TestCPUConformance(t *testing.T) {
	devicetest.Run(t, func() gpu.Device { return gpu.NewCPU(0) })
}

func TestOpen(t *testing.T) {
	tests := []struct {
		spec    string
		name    string
		wantErr error
		errText string
	}{
		{spec: "cpu", name: "cpu:0"},
		{spec: "CPU:3", name: "cpu:3"},
		{spec: " cpu:1 ", name: "cpu:1"},
		{spec: "cpu:x", wantErr: gpu.ErrBadSpec, errText: "not a non-negative integer"},
		{spec: "cpu:-1", wantErr: gpu.ErrBadSpec},
		{spec: "cpu:+1", wantErr: gpu.ErrBadSpec},
		{spec: "cpu:999", wantErr: gpu.ErrBadSpec, errText: "out of range"},
		{spec: "", wantErr: gpu.ErrBadSpec, errText: "empty"},
		{spec: "tpu:0", wantErr: gpu.ErrBadSpec, errText: "unknown kind"},
		{spec: "cuda", wantErr: gpu.ErrUnavailable, errText: "CUDA support is not built"},
		{spec: "cuda:1", wantErr: gpu.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			d, err := gpu.Open(tc.spec)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Open(%q) error = %v, want %v", tc.spec, err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.errText) {
					t.Errorf("error %q does not mention %q", err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%q): %v", tc.spec, err)
			}
			if d.Name() != tc.name {
				t.Errorf("Name = %q, want %q", d.Name(), tc.name)
			}
		})
	}
}

func TestOpenAll(t *testing.T) {
	devs, err := gpu.OpenAll(nil)
	if err != nil || len(devs) != 1 || devs[0].Name() != "cpu:0" {
		t.Fatalf("OpenAll(nil) = %v, %v", devs, err)
	}
	devs, err = gpu.OpenAll([]string{"cpu:0", "cpu:1"})
	if err != nil || len(devs) != 2 || devs[1].Name() != "cpu:1" {
		t.Fatalf("OpenAll = %v, %v", devs, err)
	}
	_, err = gpu.OpenAll([]string{"cpu", "cpu:0", "bogus"})
	if err == nil || !strings.Contains(err.Error(), "listed twice") || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("OpenAll with a duplicate and a bad spec: %v", err)
	}
}

func TestCPUMisuse(t *testing.T) {
	a, b := gpu.NewCPU(0), gpu.NewCPU(1)
	x, _ := a.Alloc(4)
	y, _ := b.Alloc(4)
	tests := []struct {
		name string
		fn   func()
	}{
		{"foreign buffer", func() { a.Copy(x, y) }},
		{"length mismatch", func() { z, _ := a.Alloc(3); a.Add(x, x, z) }},
		{"view out of range", func() { a.View(x, 2, 3) }},
		{"layer norm without columns", func() { a.LayerNorm(x, x, x, x, x, x, 1, 0, 1e-5) }},
		{"layer norm gamma too short", func() {
			g, _ := a.Alloc(1)
			a.LayerNorm(x, x, x, x, g, x, 2, 2, 1e-5)
		}},
		{"layer norm backward rstd too short", func() {
			r, _ := a.Alloc(1)
			a.LayerNormBackward(x, x, x, x, x, x, r, x, 2, 2)
		}},
		{"bad token", func() {
			tab, _ := a.Alloc(4)
			ids, _ := a.Alloc(2)
			a.CopyToDevice(ids, []float32{0, 2})
			a.Embedding(x, tab, ids, 2, 2, 2)
		}},
		{"fractional token in backward", func() {
			tab, _ := a.Alloc(4)
			ids, _ := a.Alloc(2)
			a.CopyToDevice(ids, []float32{0, 0.5})
			a.EmbeddingBackward(tab, ids, x, 2, 2, 2)
		}},
		{"embedding table too short", func() {
			tab, _ := a.Alloc(3)
			ids, _ := a.Alloc(2)
			a.Embedding(x, tab, ids, 2, 2, 2)
		}},
		{"causal softmax without positions", func() { a.CausalSoftmax(x, x, 1, 0, 1) }},
		{"causal softmax backward too short", func() { a.CausalSoftmaxBackward(x, x, x, 1, 3, 1) }},
		{"bad label", func() {
			p, _ := a.Alloc(2)
			l, _ := a.Alloc(1)
			lab, _ := a.Alloc(1)
			a.Fill(lab, 5)
			a.SoftmaxCrossEntropy(p, l, p, lab, 1, 2)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("no panic")
				}
				if s, ok := r.(string); !ok || !strings.HasPrefix(s, "gpu: ") {
					t.Errorf("panic %v lacks the gpu: prefix", r)
				}
			}()
			tc.fn()
		})
	}
}
