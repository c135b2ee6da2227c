package cuda_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
	"github.com/p2ptrain/p2ptrain/gpu/cuda/cudatest"
)

// TestOpenReportsLoader checks that, in a binary without the CUDA device
// (this test does not link gpu/cuda/cudadev), gpu.Open's CUDA specs are
// ErrUnavailable and carry the loader's reason or what it found.
func TestOpenReportsLoader(t *testing.T) {
	if !cuda.LoaderBuilt {
		t.Skip("built without the driver loader (-tags nocuda or an unsupported platform)")
	}
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	dir := t.TempDir()
	cudatest.BuildFake(t, dir, "libcuda.so.1")
	for _, tc := range []struct {
		env, spec string
		want      []string
		notFound  bool
	}{
		{env: missing, spec: "cuda:0", notFound: true,
			want: []string{`"cuda:0": no usable GPU: libcuda.so.1 not found (searched: $P2PTRAIN_CUDA_LIB=` + missing + ")"}},
		{env: missing, spec: "cuda", notFound: true, want: []string{"no usable GPU", "CUDA support is not built"}},
		{env: dir, spec: "cuda", want: []string{"found cuda:0 Fake GPU Alpha (compute 8.6), cuda:1 Fake GPU Beta (compute 9.5)", "CUDA support is not built"}},
		{env: dir, spec: "cuda:1", want: []string{"found cuda:1 Fake GPU Beta (compute 9.5), but CUDA support is not built"}},
		{env: dir, spec: "cuda:2", want: []string{`"cuda:2": no such GPU: the CUDA driver sees 2 (cuda:0 to cuda:1)`}},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			t.Setenv(cuda.EnvLibrary, tc.env)
			d, err := gpu.Open(tc.spec)
			if d != nil || !errors.Is(err, gpu.ErrUnavailable) {
				t.Fatalf("Open(%q) = %v, %v; want ErrUnavailable", tc.spec, d, err)
			}
			var nf *cuda.LibraryNotFoundError
			if errors.As(err, &nf) != tc.notFound {
				t.Errorf("errors.As(*LibraryNotFoundError) = %v, want %v", !tc.notFound, tc.notFound)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}
