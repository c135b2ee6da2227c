package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/pelletier/go-toml/v2"
)

// loadConfig reads a TOML config file over the defaults. Unknown keys and bad
// values are usage errors that name the key.
func loadConfig(path string) (config.Config, error) {
	cfg := config.DefaultConfig()
	if path == "" {
		return cfg, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, usagef("config: %v", err)
	}
	if err := decodeConfig(data, &cfg); err != nil {
		var uk unknownKeys
		if errors.As(err, &uk) {
			return cfg, usageError{uk} // the rest was decoded: resolve reports these with the others
		}
		return cfg, usagef("config %s: %v", path, err)
	}
	return cfg, nil
}

// unknownKeys are a config file's keys that no setting has. go-toml decodes
// the rest of the document before it reports them, so the range checks can
// still run and every problem is reported in one pass.
type unknownKeys []string

func (u unknownKeys) Error() string { return strings.Join(u, "\n") }

func decodeConfig(data []byte, cfg *config.Config) error {
	data = bytes.TrimPrefix(data, []byte("\uFEFF")) // a UTF-8 byte-order mark some editors write
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	err := dec.Decode(cfg)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var msgs unknownKeys
		for _, e := range strict.Errors {
			row, _ := e.Position()
			msgs = append(msgs, fmt.Sprintf("  unknown key %q (line %d)", strings.Join(e.Key(), "."), row))
		}
		return msgs
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		key := strings.Join(de.Key(), ".")
		if key != "" {
			return fmt.Errorf("%s (line %d): %v", key, row, de.Error())
		}
		return fmt.Errorf("line %d: %v", row, de.Error())
	}
	return err
}
