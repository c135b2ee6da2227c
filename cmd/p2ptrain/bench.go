package main

import (
	"context"
	"io"
)

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("bench: name what to measure: codecs")
	}
	switch args[0] {
	default:
		return usagef("bench: unknown benchmark %q (want codecs)", args[0])
	}
}
