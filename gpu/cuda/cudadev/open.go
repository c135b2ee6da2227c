package cudadev

import (
	"errors"
	"fmt"
	"sync"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
)

func init() { gpu.RegisterOpener("cuda", openSpec) }

// openSpec opens the GPUs a "cuda" or "cuda:N" spec names, for gpu.Open and
// gpu.OpenAll.
func openSpec(s gpu.Spec) ([]gpu.Device, error) {
	infos, err := cuda.Enumerate()
	if err != nil {
		return nil, fmt.Errorf("%w: %q: no usable GPU: %w", gpu.ErrUnavailable, s.String(), err)
	}
	if !s.All && s.Index >= len(infos) {
		return nil, fmt.Errorf("%w: %q: no such GPU: the CUDA driver sees %d (cuda:0 to cuda:%d)",
			gpu.ErrUnavailable, s.String(), len(infos), len(infos)-1)
	}
	idx := []int{s.Index}
	if s.All {
		idx = idx[:0]
		for i := range infos {
			idx = append(idx, i)
		}
	}
	var devs []gpu.Device
	for _, i := range idx {
		d, err := Open(i)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%w: %q: %w", gpu.ErrUnavailable, s.String(), err), gpu.CloseAll(devs))
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// images caches compiled modules in memory by cache key, so several GPUs of
// one architecture compile (or read the disk cache) once.
var (
	imagesMu sync.Mutex
	images   = make(map[string][]byte)
)

// Open opens CUDA device ordinal i: it loads the driver, cuBLAS and NVRTC,
// retains the device's primary context, creates a stream and a cuBLAS
// handle on it, and loads the kernels, compiled by NVRTC for the device's
// architecture or read from the module cache (cuda.DefaultCacheDir). Its
// errors match cuda.ErrNoGPU.
func Open(i int) (*Device, error) {
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	blas, err := cuda.LoadBLAS(drv.Version())
	if err != nil {
		return nil, err
	}
	nv, err := cuda.LoadNVRTC(drv.Version())
	if err != nil {
		return nil, err
	}
	ctx, err := drv.OpenContext(i)
	if err != nil {
		return nil, err
	}
	d := &Device{name: fmt.Sprintf("cuda:%d", i), info: ctx.Info(), ctx: ctx}
	if err := d.setup(blas, nv); err != nil {
		d.Close()
		return nil, fmt.Errorf("cuda:%d: %w", i, err)
	}
	return d, nil
}

// setup creates the cuBLAS handle, loads the kernels and allocates the error
// word.
func (d *Device) setup(blas *cuda.BLAS, nv *cuda.NVRTC) error {
	if err := d.ctx.Enter(); err != nil {
		d.ctx.Leave()
		return err
	}
	defer d.ctx.Leave()
	var err error
	if d.blas, err = blas.NewHandle(d.ctx); err != nil {
		return err
	}
	if d.mod, err = loadKernels(d.ctx, nv, d.info); err != nil {
		return err
	}
	for k, name := range KernelNames {
		if d.fns[k], err = d.ctx.Function(d.mod, name); err != nil {
			return err
		}
	}
	if d.errWord, err = d.ctx.Alloc(4); err != nil {
		return err
	}
	if err := d.ctx.Fill32(d.errWord, 0, 1); err != nil {
		return err
	}
	return d.ctx.Synchronize()
}

// loadKernels loads KernelSource into the current context, compiled for
// the device (from the caches when they hold it). An image the driver
// refuses, say a stale cache entry, is dropped and compiled afresh once.
func loadKernels(ctx *cuda.Context, nv *cuda.NVRTC, info cuda.DeviceInfo) (cuda.Module, error) {
	t := cuda.ChooseTarget(info.ComputeMajor*10+info.ComputeMinor, nv.SupportedArchs(), nv.HasCUBIN())
	key := cuda.CacheKey(t, "nvrtc "+nv.Version()+" "+nv.Path(), CompileOptions, KernelSource)
	cache := cuda.ModuleCache{Dir: cuda.DefaultCacheDir()}
	compile := func() ([]byte, error) { return nv.Compile(KernelSource, "kernels.cu", t, CompileOptions) }

	imagesMu.Lock()
	defer imagesMu.Unlock()
	img, ok := images[key]
	if !ok {
		var err error
		if img, _, err = cache.Get(key, compile); err != nil {
			return 0, err
		}
	}
	mod, err := ctx.LoadModule(img)
	if err != nil {
		delete(images, key)
		cache.Drop(key)
		fresh, cerr := compile()
		if cerr != nil {
			return 0, errors.Join(err, cerr)
		}
		if mod, err = ctx.LoadModule(fresh); err != nil {
			return 0, fmt.Errorf("loading the kernels compiled for %s: %w", t, err)
		}
		img = fresh
		cache.Put(key, fresh)
	}
	images[key] = img
	return mod, nil
}

// Close releases the device's module, cuBLAS handle and context. Buffers
// must have been freed; the Device must not be used afterwards.
func (d *Device) Close() error {
	var errs []error
	if err := d.ctx.Enter(); err != nil {
		errs = append(errs, err)
	} else {
		if d.blas != nil {
			errs = append(errs, d.blas.Destroy())
		}
		if d.errWord != 0 {
			errs = append(errs, d.ctx.Free(d.errWord))
		}
		if d.mod != 0 {
			errs = append(errs, d.ctx.UnloadModule(d.mod))
		}
	}
	d.ctx.Leave()
	errs = append(errs, d.ctx.Close())
	d.fail(errors.New("device closed"))
	return errors.Join(errs...)
}
