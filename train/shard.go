package train

import (
	"fmt"
	"slices"
)

// shardOf lays out the global batch over order, where devices[p] is the
// number of devices of member p and every device takes perDevice samples.
func shardOf(order []string, self string, devices map[string]int, perDevice int) (Shard, error) {
	if !slices.Contains(order, self) {
		return Shard{}, fmt.Errorf("train: %s is not a member of the epoch", self)
	}
	var s Shard
	equal := true
	for _, p := range order {
		d := devices[p]
		if d < 1 {
			return Shard{}, fmt.Errorf("train: member %s announced no devices", p)
		}
		equal = equal && d == devices[order[0]]
		if p == self {
			s.Offset, s.Size, s.FirstDevice = s.Global, d*perDevice, s.Global/perDevice
		}
		s.Global += d * perDevice
	}
	s.Weight = 1
	if !equal {
		s.Weight = float32(float64(s.Size) * float64(len(order)) / float64(s.Global))
	}
	return s, nil
}
