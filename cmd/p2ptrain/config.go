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
		return cfg, usagef("config %s: %v", path, err)
	}
	return cfg, nil
}

func decodeConfig(data []byte, cfg *config.Config) error {
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	err := dec.Decode(cfg)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var msgs []string
		for _, e := range strict.Errors {
			row, _ := e.Position()
			msgs = append(msgs, fmt.Sprintf("unknown key %q (line %d)", strings.Join(e.Key(), "."), row))
		}
		return errors.New(strings.Join(msgs, "; "))
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
