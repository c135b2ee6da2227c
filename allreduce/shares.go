package allreduce

import (
	"fmt"
	"math"
)

// checkShares validates proportional shares for w peers.
func checkShares(shares []float64, w int) error {
	if len(shares) != w {
		return fmt.Errorf("%w: %d shares for %d peers", ErrConfig, len(shares), w)
	}
	sum := 0.0
	for i, x := range shares {
		if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%w: share %d is %v", ErrConfig, i, x)
		}
		sum += x
	}
	if math.Abs(sum-1) > 1e-6 {
		return fmt.Errorf("%w: shares sum to %v, want 1", ErrConfig, sum)
	}
	return nil
}
