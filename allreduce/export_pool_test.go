package allreduce

// SetFramePoisoning makes every session's frame pool overwrite each buffer
// it takes back (0xFF bytes: NaN as fp32), so that a frame read after it
// was recycled shows up as wrong results or, under the race detector, as
// a race with the overwrite. It returns the previous setting.
func SetFramePoisoning(on bool) bool { return framePoisoning.Swap(on) }
