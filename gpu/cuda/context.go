package cuda

import (
	"fmt"
	"runtime"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// Module is a loaded module (CUmodule); Function is a kernel in one
// (CUfunction).
type (
	Module   uintptr
	Function uintptr
)

// deviceAPI holds the driver functions a Context uses. They are bound the
// first time a Context is opened, so a library that only lists devices (the
// test stand-ins, say) still enumerates.
type deviceAPI struct {
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) Result
	cuDevicePrimaryCtxRelease func(dev int32) Result
	cuCtxSetCurrent           func(ctx uintptr) Result
	cuStreamCreate            func(stream *uintptr, flags uint32) Result
	cuStreamDestroy           func(stream uintptr) Result
	cuStreamSynchronize       func(stream uintptr) Result
	cuMemAlloc                func(p *DevicePtr, bytes uint64) Result
	cuMemFree                 func(p DevicePtr) Result
	cuMemcpyHtoDAsync         func(dst DevicePtr, src unsafe.Pointer, bytes uint64, stream uintptr) Result
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src DevicePtr, bytes uint64, stream uintptr) Result
	cuMemcpyDtoDAsync         func(dst, src DevicePtr, bytes uint64, stream uintptr) Result
	cuMemsetD32Async          func(dst DevicePtr, v uint32, n uint64, stream uintptr) Result
	cuModuleLoadData          func(m *Module, image unsafe.Pointer) Result
	cuModuleUnload            func(m Module) Result
	cuModuleGetFunction       func(f *Function, m Module, name string) Result
	cuLaunchKernel            func(f Function, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params unsafe.Pointer, extra unsafe.Pointer) Result
}

func (a *deviceAPI) symbols() []symbol {
	return []symbol{
		{name: "cuDevicePrimaryCtxRetain", fptr: &a.cuDevicePrimaryCtxRetain},
		{name: "cuDevicePrimaryCtxRelease_v2", fptr: &a.cuDevicePrimaryCtxRelease},
		{name: "cuCtxSetCurrent", fptr: &a.cuCtxSetCurrent},
		{name: "cuStreamCreate", fptr: &a.cuStreamCreate},
		{name: "cuStreamDestroy_v2", fptr: &a.cuStreamDestroy},
		{name: "cuStreamSynchronize", fptr: &a.cuStreamSynchronize},
		{name: "cuMemAlloc_v2", fptr: &a.cuMemAlloc},
		{name: "cuMemFree_v2", fptr: &a.cuMemFree},
		{name: "cuMemcpyHtoDAsync_v2", fptr: &a.cuMemcpyHtoDAsync},
		{name: "cuMemcpyDtoHAsync_v2", fptr: &a.cuMemcpyDtoHAsync},
		{name: "cuMemcpyDtoDAsync_v2", fptr: &a.cuMemcpyDtoDAsync},
		{name: "cuMemsetD32Async", fptr: &a.cuMemsetD32Async},
		{name: "cuModuleLoadData", fptr: &a.cuModuleLoadData},
		{name: "cuModuleUnload", fptr: &a.cuModuleUnload},
		{name: "cuModuleGetFunction", fptr: &a.cuModuleGetFunction},
		{name: "cuLaunchKernel", fptr: &a.cuLaunchKernel},
	}
}

// deviceFuncs binds the device API on first use.
func (d *Driver) deviceFuncs() (*deviceAPI, error) {
	d.apiOnce.Do(func() {
		a := &deviceAPI{}
		if _, err := bindSymbols(d.handle, d.lib, "", a.symbols()); err != nil {
			d.apiErr = err
			return
		}
		d.api = a
	})
	return d.api, d.apiErr
}

// Context is one device's primary context and a stream on it: the memory,
// module and launch calls of the driver API for that device. Work issued
// through a Context runs in issue order on its stream.
//
// The driver keeps the current context per OS thread, and a goroutine may
// move between threads between any two calls. So every use of a Context is
// bracketed: Enter locks the goroutine to its thread and makes the context
// current there, Leave unlocks. Calls between them stay on that thread.
// A Context may be used by one goroutine at a time.
type Context struct {
	api    *deviceAPI
	drv    *Driver
	info   DeviceInfo
	dev    int32
	ctx    uintptr
	stream uintptr
}

// OpenContext retains device ordinal i's primary context and creates a
// stream on it.
func (d *Driver) OpenContext(i int) (*Context, error) {
	api, err := d.deviceFuncs()
	if err != nil {
		return nil, err
	}
	if i < 0 || i > maxDevices {
		return nil, fmt.Errorf("cuda: device ordinal %d out of range", i)
	}
	info, err := d.device(int32(i))
	if err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", i, err)
	}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(i))); err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", i, err)
	}
	c := &Context{api: api, drv: d, info: info, dev: dev}
	if err := d.check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&c.ctx, dev)); err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", i, err)
	}
	err = c.Enter()
	if err == nil {
		// Flags 0: a blocking stream, so the legacy default stream (which
		// libraries may use behind our back) stays ordered with it.
		err = d.check("cuStreamCreate", api.cuStreamCreate(&c.stream, 0))
	}
	c.Leave()
	if err != nil {
		api.cuDevicePrimaryCtxRelease(dev)
		return nil, fmt.Errorf("cuda:%d: %w", i, err)
	}
	return c, nil
}

// Info describes the context's device.
func (c *Context) Info() DeviceInfo { return c.info }

// Stream returns the context's stream (a CUstream), for libraries such as
// cuBLAS that issue work on it.
func (c *Context) Stream() uintptr { return c.stream }

// Enter locks the calling goroutine to its OS thread and makes the context
// current there. Leave must follow, even when Enter fails.
func (c *Context) Enter() error {
	runtime.LockOSThread()
	return c.drv.check("cuCtxSetCurrent", c.api.cuCtxSetCurrent(c.ctx))
}

// Leave undoes Enter's thread lock.
func (c *Context) Leave() { runtime.UnlockOSThread() }

// Close destroys the stream and releases the primary context. Buffers and
// modules must have been freed first.
func (c *Context) Close() error {
	err := c.Enter()
	if err == nil {
		err = c.drv.check("cuStreamDestroy_v2", c.api.cuStreamDestroy(c.stream))
	}
	c.Leave()
	if rerr := c.drv.check("cuDevicePrimaryCtxRelease_v2", c.api.cuDevicePrimaryCtxRelease(c.dev)); err == nil {
		err = rerr
	}
	return err
}

// The methods below must be called between Enter and Leave.

// Alloc allocates bytes of device memory (not zeroed).
func (c *Context) Alloc(bytes uint64) (DevicePtr, error) {
	var p DevicePtr
	err := c.drv.check("cuMemAlloc_v2", c.api.cuMemAlloc(&p, bytes))
	return p, err
}

// Free frees memory from Alloc.
func (c *Context) Free(p DevicePtr) error {
	return c.drv.check("cuMemFree_v2", c.api.cuMemFree(p))
}

// CopyToDevice copies bytes from host memory at src to dst, in stream order,
// and waits for the copy, so src may be reused when it returns.
func (c *Context) CopyToDevice(dst DevicePtr, src unsafe.Pointer, bytes uint64) error {
	if err := c.drv.check("cuMemcpyHtoDAsync_v2", c.api.cuMemcpyHtoDAsync(dst, src, bytes, c.stream)); err != nil {
		return err
	}
	return c.Synchronize()
}

// CopyToHost copies bytes from src to host memory at dst after all earlier
// work on the stream, and waits for it.
func (c *Context) CopyToHost(dst unsafe.Pointer, src DevicePtr, bytes uint64) error {
	if err := c.drv.check("cuMemcpyDtoHAsync_v2", c.api.cuMemcpyDtoHAsync(dst, src, bytes, c.stream)); err != nil {
		return err
	}
	return c.Synchronize()
}

// Copy queues a device-to-device copy of bytes.
func (c *Context) Copy(dst, src DevicePtr, bytes uint64) error {
	return c.drv.check("cuMemcpyDtoDAsync_v2", c.api.cuMemcpyDtoDAsync(dst, src, bytes, c.stream))
}

// Fill32 queues setting n 32-bit words at dst to v.
func (c *Context) Fill32(dst DevicePtr, v uint32, n uint64) error {
	return c.drv.check("cuMemsetD32Async", c.api.cuMemsetD32Async(dst, v, n, c.stream))
}

// Synchronize waits for all work queued on the stream.
func (c *Context) Synchronize() error {
	return c.drv.check("cuStreamSynchronize", c.api.cuStreamSynchronize(c.stream))
}

// LoadModule loads a compiled image (PTX, which the driver compiles, or a
// cubin) into the context.
func (c *Context) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuda: empty module image")
	}
	var m Module
	err := c.drv.check("cuModuleLoadData", c.api.cuModuleLoadData(&m, unsafe.Pointer(&image[0])))
	runtime.KeepAlive(image)
	return m, err
}

// UnloadModule unloads a module.
func (c *Context) UnloadModule(m Module) error {
	return c.drv.check("cuModuleUnload", c.api.cuModuleUnload(m))
}

// Function returns the kernel name in module m.
func (c *Context) Function(m Module, name string) (Function, error) {
	var f Function
	if err := c.drv.check("cuModuleGetFunction", c.api.cuModuleGetFunction(&f, m, name)); err != nil {
		return 0, fmt.Errorf("kernel %s: %w", name, err)
	}
	return f, nil
}

// Launch queues kernel f on a grid of blocks (1-D: grid blocks of block
// threads, no dynamic shared memory). params holds a pointer to each
// argument's value, in order; the driver copies the values before Launch
// returns.
func (c *Context) Launch(f Function, grid, block uint32, params []unsafe.Pointer) error {
	var p unsafe.Pointer
	if len(params) > 0 {
		p = unsafe.Pointer(&params[0])
	}
	r := c.api.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, c.stream, p, nil)
	runtime.KeepAlive(params)
	return c.drv.check("cuLaunchKernel", r)
}
