package cuda

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestCacheKey checks that every input of a compilation changes the key.
func TestCacheKey(t *testing.T) {
	base := CacheKey(Target{Arch: 86, CUBIN: true}, "nvrtc 12.4", []string{"-fmad=false"}, "src")
	if base != CacheKey(Target{Arch: 86, CUBIN: true}, "nvrtc 12.4", []string{"-fmad=false"}, "src") {
		t.Fatal("CacheKey is not a function of its inputs")
	}
	if !bytes.HasPrefix([]byte(base), []byte("sm_86-")) {
		t.Errorf("key %q does not start with the target", base)
	}
	for name, k := range map[string]string{
		"arch":     CacheKey(Target{Arch: 90, CUBIN: true}, "nvrtc 12.4", []string{"-fmad=false"}, "src"),
		"kind":     CacheKey(Target{Arch: 86}, "nvrtc 12.4", []string{"-fmad=false"}, "src"),
		"compiler": CacheKey(Target{Arch: 86, CUBIN: true}, "nvrtc 12.6", []string{"-fmad=false"}, "src"),
		"options":  CacheKey(Target{Arch: 86, CUBIN: true}, "nvrtc 12.4", nil, "src"),
		"source":   CacheKey(Target{Arch: 86, CUBIN: true}, "nvrtc 12.4", []string{"-fmad=false"}, "src "),
		"boundary": CacheKey(Target{Arch: 86, CUBIN: true}, "nvrtc 12.4", []string{"-fmad=falsesrc"}, ""),
	} {
		if k == base {
			t.Errorf("changing the %s keeps the key %s", name, k)
		}
	}
}

// counter is a build function that counts its calls.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) build(img string) func() ([]byte, error) {
	return func() ([]byte, error) {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
		return []byte(img), nil
	}
}

// TestModuleCache checks hits, misses, and that corrupt entries are rebuilt
// and rewritten, never fatal.
func TestModuleCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "p2ptrain", "cuda") // created on first write
	c := ModuleCache{Dir: dir}
	var cnt counter
	get := func(wantCache bool) {
		t.Helper()
		img, hit, err := c.Get("sm_86-abc", cnt.build("IMAGE"))
		if err != nil || string(img) != "IMAGE" || hit != wantCache {
			t.Fatalf("Get = %q, from cache %v, %v; want IMAGE, %v", img, hit, err, wantCache)
		}
	}
	get(false)
	get(true)
	if cnt.n != 1 {
		t.Fatalf("%d builds, want 1", cnt.n)
	}
	file := filepath.Join(dir, "sm_86-abc.bin")
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for name, corrupt := range map[string][]byte{
		"flipped byte": append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^1),
		"truncated":    good[:len(good)-2],
		"header only":  good[:len(cacheMagic)+32],
		"empty":        {},
		"wrong magic":  append([]byte("p2ptrain cuda module v0\n"), good[len(cacheMagic):]...),
	} {
		if err := os.WriteFile(file, corrupt, 0o644); err != nil {
			t.Fatal(err)
		}
		before := cnt.n
		get(false)
		if cnt.n != before+1 {
			t.Errorf("%s: not rebuilt", name)
		}
		if b, _ := os.ReadFile(file); !bytes.Equal(b, good) {
			t.Errorf("%s: entry not rewritten", name)
		}
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, ".tmp-*")); len(tmps) != 0 {
		t.Errorf("temporary files left: %v", tmps)
	}
	c.Drop("sm_86-abc")
	get(false)

	// A failed build is returned and caches nothing.
	boom := errors.New("boom")
	if _, _, err := c.Get("k2", func() ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("build error = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "k2.bin")); err == nil {
		t.Error("a failed build left an entry")
	}
}

// TestModuleCacheUnusable checks that no cache directory, or one that cannot
// be written, only costs the caching.
func TestModuleCacheUnusable(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", notDir, filepath.Join(notDir, "sub")} {
		var cnt counter
		c := ModuleCache{Dir: dir}
		for range 2 {
			if img, hit, err := c.Get("k", cnt.build("I")); err != nil || hit || string(img) != "I" {
				t.Errorf("dir %q: Get = %q, %v, %v", dir, img, hit, err)
			}
		}
		if cnt.n != 2 {
			t.Errorf("dir %q: %d builds, want 2", dir, cnt.n)
		}
	}
}

// TestModuleCacheConcurrent has processes' worth of writers race on one
// entry (run with -race): every reader gets a whole image.
func TestModuleCacheConcurrent(t *testing.T) {
	c := ModuleCache{Dir: t.TempDir()}
	img := bytes.Repeat([]byte("0123456789"), 10000)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			for range 20 {
				got, _, err := c.Get("k", func() ([]byte, error) { return img, nil })
				if err == nil && !bytes.Equal(got, img) {
					err = errors.New("torn image")
				}
				if err != nil {
					errs[i] = err
					return
				}
				if i%2 == 0 {
					c.Put("k", img)
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestDefaultCacheDir checks the environment variables it follows.
func TestDefaultCacheDir(t *testing.T) {
	t.Setenv(EnvCacheDir, "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if got := DefaultCacheDir(); got != "/xdg/p2ptrain/cuda" {
		t.Errorf("with XDG_CACHE_HOME: %q", got)
	}
	t.Setenv(EnvCacheDir, "/elsewhere")
	if got := DefaultCacheDir(); got != "/elsewhere" {
		t.Errorf("with %s: %q", EnvCacheDir, got)
	}
	t.Setenv(EnvCacheDir, "off")
	if got := DefaultCacheDir(); got != "" {
		t.Errorf("%s=off: %q", EnvCacheDir, got)
	}
}
