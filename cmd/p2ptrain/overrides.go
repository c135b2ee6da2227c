package main

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/p2ptrain/p2ptrain/config"
)

// Configuration overrides: P2PTRAIN_<SECTION>_<KEY> environment variables
// and --set section.key=value on the command line, applied over the config
// file (docs/configuration.md). The keys are config.Config's toml tags, so a
// key added there can be overridden with no change here, and each value is
// decoded by the TOML decoder the file goes through, with the same types and
// the same Duration parsing.

// envPrefix starts the name of every environment variable p2ptrain reads.
const envPrefix = "P2PTRAIN_"

// otherEnv are the P2PTRAIN_ environment variables that are not
// configuration keys: overrides ignore them, and any other P2PTRAIN_
// variable that names no key is an error. docs/configuration.md lists them
// with what each does; TestOtherEnvComplete keeps this list, those docs
// and the repository's uses in step.
var otherEnv = []string{
	"P2PTRAIN_CHAOS_LOGS",       // e2e/chaos: keep every process's output in this directory
	"P2PTRAIN_CHAOS_TABLE",      // e2e/chaos: write the results table to this file
	"P2PTRAIN_CUBLAS_LIB",       // gpu/cuda: the cuBLAS library file or directory
	"P2PTRAIN_CUDA_CACHE",       // gpu/cuda: the compiled-kernel cache directory ("off": none)
	"P2PTRAIN_CUDA_LIB",         // gpu/cuda: the CUDA driver library file or directory
	"P2PTRAIN_CUDA_TEST_CHILD",  // gpu/cuda tests: marks the loader test's child process
	"P2PTRAIN_DATA",             // data: the Fashion-MNIST directory searched first
	"P2PTRAIN_EPOCHS",           // data's Fashion-MNIST benchmark: epochs
	"P2PTRAIN_LR",               // data's Fashion-MNIST benchmark: learning rate
	"P2PTRAIN_MODEL",            // data's Fashion-MNIST benchmark: model
	"P2PTRAIN_NVRTC_LIB",        // gpu/cuda: the NVRTC library file or directory
	"P2PTRAIN_OPT",              // data's Fashion-MNIST benchmark: optimizer
	"P2PTRAIN_REQUIRE_GPU",      // GPU tests: 1 fails them instead of skipping without a GPU
	"P2PTRAIN_SCALE_TABLE",      // allreducebench: 1 runs TestScaleTable (scripts/scale-table.sh)
	"P2PTRAIN_SIGNAL_TEST_ARGS", // cmd/p2ptrain tests: the command a signal test's child runs
	"P2PTRAIN_SKIP_BROWSER",     // e2e: 1 skips the page's browser test without chromium
	"P2PTRAIN_SOCKET",           // python/: the daemon's socket for a PyTorch script
	"P2PTRAIN_TEST_LOG",         // tests: log level of in-process test peers
}

// configKey is one key of the configuration: a leaf of config.Config.
type configKey struct {
	name  string       // dotted, as in --set: "train.steps", "train.gpt.layers"
	index []int        // the field's index path in config.Config
	typ   reflect.Type // the field's type
}

// env returns the key's environment variable: P2PTRAIN_TRAIN_GPT_LAYERS for
// train.gpt.layers.
func (k configKey) env() string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(k.name, ".", "_"))
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// configKeys returns every key of config.Config, from its toml tags: a
// struct field is a table (its fields are keys under its name) unless it
// decodes itself from text; fields tagged "-" are not keys.
func configKeys() []configKey {
	var keys []configKey
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if tag == "-" || !f.IsExported() {
				continue
			}
			if tag == "" {
				tag = f.Name // as the TOML decoder matches an untagged field
			}
			k := configKey{name: prefix + tag, index: append(slices.Clone(index), i), typ: f.Type}
			if f.Type.Kind() == reflect.Struct && !reflect.PointerTo(f.Type).Implements(textUnmarshaler) {
				walk(f.Type, k.name+".", k.index)
				continue
			}
			keys = append(keys, k)
		}
	}
	walk(reflect.TypeFor[config.Config](), "", nil)
	return keys
}

// applyOverrides sets cfg's keys from the environment's P2PTRAIN_ variables
// (environ holds NAME=VALUE entries, as os.Environ returns them), then from
// sets (--set's section.key=value arguments, later ones winning), and
// returns every problem at once: unknown keys, malformed assignments and
// values the key's type does not take. It records in src where each key
// it set came from (the variable, or the --set argument).
func applyOverrides(cfg *config.Config, environ, sets []string, src sources) error {
	keys := configKeys()
	byName := make(map[string]configKey, len(keys))
	byEnv := make(map[string]configKey, len(keys))
	for _, k := range keys {
		byName[k.name], byEnv[k.env()] = k, k
	}
	var errs []error
	environ = slices.Sorted(slices.Values(environ)) // a stable order for the messages
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || slices.Contains(otherEnv, name) {
			continue
		}
		k, ok := byEnv[name]
		if !ok {
			errs = append(errs, fmt.Errorf("environment variable %s: no configuration key has this name%s; "+
				"docs/configuration.md lists the project's other P2PTRAIN_ variables",
				name, suggest(keys, name, configKey.env, "")))
			continue
		}
		errs = append(errs, k.set(cfg, val, name+"="+val))
		src[k.name] = "environment variable " + name
	}
	for _, s := range sets {
		name, val, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		switch k, known := byName[name]; {
		case !ok:
			errs = append(errs, fmt.Errorf("--set %s: want section.key=value, e.g. --set train.steps=100", s))
		case !known:
			dotted := func(k configKey) string { return k.name }
			errs = append(errs, fmt.Errorf("--set %s: unknown key %q%s", s, name, suggest(keys, name, dotted, " (config.toml lists every key)")))
		default:
			errs = append(errs, k.set(cfg, val, "--set "+s))
			src[k.name] = "--set " + s
		}
	}
	return errors.Join(errs...)
}

// sources records where configuration keys that did not come from the
// file came from, by dotted key: "environment variable P2PTRAIN_TRAIN_STEPS",
// "--set train.steps=5", "--steps".
type sources map[string]string

// annotate appends to each of the joined errors of err (Validate's,
// preflight's) whose key (the text before its first ": ", less an index
// such as "[0]") did not come from the file where it came from, so that a
// value from a forgotten environment variable is not taken for the file's.
func (src sources) annotate(err error) error {
	if err == nil || len(src) == 0 {
		return err
	}
	var out []error
	for _, e := range leaves(err) {
		if from, ok := src[keyOf(e)]; ok {
			e = fmt.Errorf("%w (set by %s)", e, from)
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// keyOf returns the configuration key a check's error e names: the text
// before its first ": ", less an index ("train.devices[2]" is
// train.devices'); "" when it names none.
func keyOf(e error) string {
	key, _, ok := strings.Cut(e.Error(), ": ")
	if !ok {
		return ""
	}
	base, _, _ := strings.Cut(key, "[")
	return base
}

// leaves returns the errors that err joins, however deeply (errors.Join of
// joins), or err itself.
func leaves(err error) []error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range joined.Unwrap() {
		out = append(out, leaves(e)...)
	}
	return out
}

// suggest names the keys a mistyped name may have meant, as a remark to
// append to an error: those a letter or two away, or a table's keys; with
// none, it returns otherwise. name and each key are compared in the form
// form gives (dotted, or a variable).
func suggest(keys []configKey, name string, form func(configKey) string, otherwise string) string {
	var near []string
	for _, k := range keys {
		if s := form(k); editDistance(s, name) <= 2 || strings.HasPrefix(s, name+".") || strings.HasPrefix(s, name+"_") {
			near = append(near, s)
		}
	}
	if len(near) > 3 {
		near = append(near[:3], "…")
	}
	if len(near) == 0 {
		return otherwise
	}
	return " (did you mean " + strings.Join(near, ", ") + "?)"
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// set decodes raw as the key's value, as the config file would, and stores
// it in cfg; source (the --set argument, or the variable as NAME=VALUE)
// names it in errors.
func (k configKey) set(cfg *config.Config, raw, source string) error {
	lit, err := k.literal(raw)
	if err != nil {
		return fmt.Errorf("%s: %s: %v", source, k.name, err)
	}
	// Decode a one-key document into a fresh Config and copy that one field:
	// the TOML decoder does the parsing, and nothing else can change.
	var tmp config.Config
	dec := toml.NewDecoder(strings.NewReader(k.name + " = " + lit + "\n")).DisallowUnknownFields()
	if err := dec.Decode(&tmp); err != nil {
		if kind := k.typ.Kind(); k.typ.PkgPath() == "" && (kind == reflect.Bool || kind >= reflect.Int && kind <= reflect.Float64) {
			// go-toml's parse error ("expected keyword \"true\"") says nothing useful about a
			// plain scalar; a type of the config's own (a duration) explains itself.
			return fmt.Errorf("%s: %s takes %s, not %q", source, k.name, describeType(k.typ), strings.TrimSpace(raw))
		}
		return fmt.Errorf("%s: %s takes %s: %s", source, k.name, describeType(k.typ), strings.TrimPrefix(err.Error(), "toml: "))
	}
	reflect.ValueOf(cfg).Elem().FieldByIndex(k.index).Set(reflect.ValueOf(tmp).FieldByIndex(k.index))
	return nil
}

// isDuration reports whether t is config.Duration.
func isDuration(t reflect.Type) bool { return t == reflect.TypeFor[config.Duration]() }

// isStages reports whether t is config.Stages (an integer or "auto").
func isStages(t reflect.Type) bool { return t == reflect.TypeFor[config.Stages]() }

// literal writes raw as a TOML value of the key's type: strings are taken
// as they are (quoted here), durations as the file accepts them (a string
// such as 5s, or a bare integer of nanoseconds), lists as a TOML array or
// comma-separated elements, anything else as TOML writes it.
func (k configKey) literal(raw string) (string, error) {
	if k.typ.Kind() == reflect.String {
		return tomlString(raw), nil
	}
	v := strings.TrimSpace(raw)
	if strings.ContainsAny(v, "\r\n") {
		return "", errors.New("a value must be one line")
	}
	switch {
	case isDuration(k.typ) || isStages(k.typ):
		if _, err := strconv.ParseInt(strings.ReplaceAll(v, "_", ""), 0, 64); err == nil {
			return v, nil // nanoseconds or stages, as in the file: Validate explains a value this small
		}
		return tomlString(v), nil
	case k.typ.Kind() == reflect.Slice:
		if v == "" {
			return "[]", nil
		}
		if strings.HasPrefix(v, "[") {
			return v, nil // a TOML array
		}
		elem := configKey{name: k.name, typ: k.typ.Elem()}
		parts := strings.Split(v, ",")
		for i, p := range parts {
			lit, err := elem.literal(strings.TrimSpace(p))
			if err != nil {
				return "", err
			}
			parts[i] = lit
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	}
	return v, nil
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// describeType says what values a key of type t takes, for errors.
func describeType(t reflect.Type) string {
	switch {
	case isDuration(t):
		return "a duration"
	case isStages(t):
		return "an integer or \"auto\""
	case t.Kind() == reflect.Slice:
		return "a list (comma-separated, or a TOML array) of " + strings.TrimPrefix(strings.TrimPrefix(describeType(t.Elem()), "an "), "a ") + "s"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		return "a non-negative integer"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "an integer"
	}
	return "a string"
}
