package allreduce

// PassRecurrence exposes PassSeconds' recurrence, which PassSeconds skips
// for uniform links, to check it against the closed form.
func PassRecurrence(edges []Link, n, segElems, chunkElems int) float64 {
	m, c := wire(segElems, max(chunkElems, 1))
	return passRecurrence(edges, n, segElems, max(chunkElems, 1), m, c)
}
