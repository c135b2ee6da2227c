package main

import (
	"errors"
	"flag"
	"io"
	"strings"
)

// errHelp is returned when -h was asked for; the usage was printed already.
var errHelp = errors.New("help requested")

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// newFlagSet returns a flag set that reports errors instead of exiting and
// prints its help (-h) to stdout.
func newFlagSet(name string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	return fs
}

// parseFlags parses args, turning flag errors into usage errors and rejecting
// stray positional arguments. -h prints the usage to the flag set's output
// (stdout); an error prints nothing here: main prints it once, with a hint
// where the usage is.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseOnce(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// parseFlagsAndArgs is parseFlags for commands that take positional
// arguments: they may come before, between or after the flags, and are
// returned in order.
func parseFlagsAndArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseOnce(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// parseOnce runs fs.Parse, printing the usage for -h and turning errors
// into usage errors.
func parseOnce(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard) // the flag package prints errors and the usage on its own
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return errHelp
	}
	if err != nil {
		return usagef("%s: %w\n  (p2ptrain help %s lists the flags)", fs.Name(), err, fs.Name())
	}
	return nil
}

// setFlags returns the names of the flags given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
