//go:build race

package sgemm

// raceEnabled is true under the race detector, whose sync.Pool drops items.
const raceEnabled = true
