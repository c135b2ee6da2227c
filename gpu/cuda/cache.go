package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
)

// EnvCacheDir names the environment variable that overrides the module
// cache directory; "off" disables the cache.
const EnvCacheDir = "P2PTRAIN_CUDA_CACHE"

// cacheMagic starts every cache entry; the SHA-256 of the payload follows.
const cacheMagic = "p2ptrain cuda module v1\n"

// DefaultCacheDir returns where compiled kernels are cached:
// $P2PTRAIN_CUDA_CACHE when set ("" when it is "off"), else
// $XDG_CACHE_HOME/p2ptrain/cuda, else ~/.cache/p2ptrain/cuda; "" when no
// home directory is known.
func DefaultCacheDir() string {
	if d := os.Getenv(EnvCacheDir); d != "" {
		if d == "off" {
			return ""
		}
		return d
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(base, "p2ptrain", "cuda")
}

// CacheKey names a compiled module: the target, the compiler's version, the
// options and the SHA-256 of the source, so a change to any of them
// compiles afresh.
func CacheKey(t Target, compiler string, opts []string, src string) string {
	h := sha256.New()
	for _, s := range append([]string{t.String(), compiler, src}, opts...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return t.String() + "-" + hex.EncodeToString(h.Sum(nil))[:32]
}

// ModuleCache keeps compiled kernel images on disk, one file per key. A
// missing, unreadable or corrupt entry is compiled again and rewritten; a
// directory that cannot be written only costs the caching. Writes go to a
// temporary file renamed into place, so concurrent processes never see half
// an entry.
type ModuleCache struct {
	// Dir is the cache directory; "" disables caching.
	Dir string
}

// Get returns the image cached under key, or calls build, caches its result
// and returns it. fromCache reports which. Only build's error is returned.
func (c ModuleCache) Get(key string, build func() ([]byte, error)) (image []byte, fromCache bool, err error) {
	if img, ok := c.read(key); ok {
		return img, true, nil
	}
	img, err := build()
	if err != nil {
		return nil, false, err
	}
	c.Put(key, img)
	return img, false, nil
}

// Drop removes the entry for key (e.g. one the driver would not load).
func (c ModuleCache) Drop(key string) {
	if c.Dir != "" {
		os.Remove(c.path(key))
	}
}

func (c ModuleCache) path(key string) string {
	return filepath.Join(c.Dir, strings.ReplaceAll(key, string(filepath.Separator), "_")+".bin")
}

// read returns a verified entry.
func (c ModuleCache) read(key string) ([]byte, bool) {
	if c.Dir == "" {
		return nil, false
	}
	b, err := os.ReadFile(c.path(key))
	if err != nil || len(b) < len(cacheMagic)+sha256.Size || !bytes.HasPrefix(b, []byte(cacheMagic)) {
		return nil, false
	}
	sum, payload := b[len(cacheMagic):len(cacheMagic)+sha256.Size], b[len(cacheMagic)+sha256.Size:]
	if got := sha256.Sum256(payload); len(payload) == 0 || !bytes.Equal(got[:], sum) {
		return nil, false
	}
	return payload, true
}

// Put stores img under key, atomically; a failure to write only costs the
// caching.
func (c ModuleCache) Put(key string, img []byte) {
	if c.Dir == "" || os.MkdirAll(c.Dir, 0o755) != nil {
		return
	}
	f, err := os.CreateTemp(c.Dir, ".tmp-*")
	if err != nil {
		return
	}
	sum := sha256.Sum256(img)
	_, err = f.Write(append(append([]byte(cacheMagic), sum[:]...), img...))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), c.path(key))
	}
	if err != nil {
		os.Remove(f.Name())
	}
}
