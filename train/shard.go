package train

import (
	"fmt"
	"slices"
)

// shard is one peer's part of each step's global batch in a ring epoch.
// Peers may have different numbers of devices, each device taking
// train.batch_size samples, so their parts differ in size.
type shard struct {
	// offset and size place this peer's samples at positions
	// [offset, offset+size) of the global batch of global samples.
	offset, size, global int
	// firstDevice is the global index of this peer's first device batch
	// (the random layers' seed).
	firstDevice int
	// weight scales this peer's local mean gradient before the ring
	// averages the members' gradients with equal weights, so that the
	// result is the mean over the global batch: size·world/global (exactly 1
	// when every member has as many samples).
	weight float32
}

// shardOf lays out the global batch over order, where devices[p] is the
// number of devices of member p and every device takes perDevice samples.
func shardOf(order []string, self string, devices map[string]int, perDevice int) (shard, error) {
	if !slices.Contains(order, self) {
		return shard{}, fmt.Errorf("train: %s is not a member of the epoch", self)
	}
	var s shard
	equal := true
	for _, p := range order {
		d := devices[p]
		if d < 1 {
			return shard{}, fmt.Errorf("train: member %s announced no devices", p)
		}
		equal = equal && d == devices[order[0]]
		if p == self {
			s.offset, s.size, s.firstDevice = s.global, d*perDevice, s.global/perDevice
		}
		s.global += d * perDevice
	}
	s.weight = 1
	if !equal {
		s.weight = float32(float64(s.size) * float64(len(order)) / float64(s.global))
	}
	return s, nil
}
