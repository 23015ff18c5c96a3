// Package schemagen generates one JSON Schema per event type and version
// from the Go types in the events catalogue, so that non-Go tools can
// consume the log. The files live in schemas/ and a test keeps them current.
package schemagen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/berth-ci/berth/events"
	"github.com/invopop/jsonschema"
)

// Files returns file name → schema bytes for every event type, plus
// envelope.json for the CloudEvents envelope.
func Files() (map[string][]byte, error) {
	out := map[string][]byte{}
	r := &jsonschema.Reflector{ExpandedStruct: true, DoNotReference: true, AllowAdditionalProperties: true}
	types := events.Types()
	names := make([]string, 0, len(types))
	for t := range types {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		s := r.Reflect(types[t])
		s.ID = jsonschema.ID("https://berth.dev/schemas/" + t + ".json")
		s.Title = t
		s.Description = "data of a " + t + " CloudEvent in stream " + events.StreamName
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("schema for %s: %w", t, err)
		}
		out[t+".json"] = append(b, '\n')
	}
	env := r.Reflect(&events.Envelope{})
	env.ID = "https://berth.dev/schemas/envelope.json"
	env.Title = "CloudEvents 1.0 structured envelope of every Berth event"
	b, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		return nil, err
	}
	out["envelope.json"] = append(b, '\n')
	return out, nil
}

// Write replaces dir's *.json files with the generated ones.
func Write(dir string) error {
	files, err := Files()
	if err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
