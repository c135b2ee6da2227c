package model

// BatchSamples is a sample set made of a batch's samples, in order: a
// held-out set built in memory (tests, tools). N is the number of samples
// in B.
type BatchSamples struct {
	B Batch
	N int
}

var _ Samples = BatchSamples{}

// Len implements Samples.
func (s BatchSamples) Len() int { return s.N }

// SampleLen implements Samples.
func (s BatchSamples) SampleLen() int {
	if s.N <= 0 {
		return 0
	}
	return len(s.B.X) / s.N
}

// Slice implements Samples: samples [lo, hi), sharing B's memory.
func (s BatchSamples) Slice(lo, hi int) Batch {
	x, y := s.SampleLen(), len(s.B.Y)/max(s.N, 1)
	return Batch{X: s.B.X[lo*x : hi*x], Y: s.B.Y[lo*y : hi*y]}
}
