package config

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/berth-ci/berth/services/vmagent/backend"
	"go.yaml.in/yaml/v3"
)

// Backend is an agent's `backend:` section: exactly one key, the kind of a
// registered backend (exec, ec2, vz, ...), holding that backend's settings:
// `backend: {exec: {create: [...], stop: [...]}}`. The settings type comes
// from the backend's package (backend.Register), so a new backend needs no
// field here. An optional `kind:` beside the section is accepted for older
// files and must name the same kind.
type Backend struct {
	// Kind is the section's key.
	Kind string
	// Settings is the decoded section (*exec.Settings, *ec2.Settings, ...).
	Settings backend.Settings
	// failed: the section did not decode, and that error was reported.
	failed bool
}

// Steps returns the backend's step deadlines (nil without settings).
func (b *Backend) Steps() *backend.Steps {
	if b.Settings == nil {
		return nil
	}
	return b.Settings.StepDeadlines()
}

// MarshalYAML writes the section back as `{<kind>: settings}`, so that a
// config built in Go survives a trip through a file.
func (b Backend) MarshalYAML() (any, error) {
	if b.Settings == nil {
		return map[string]any{"kind": b.Kind}, nil
	}
	return map[string]any{b.Kind: b.Settings}, nil
}

// decodeNode reads the section strictly: one known kind, its settings with
// no unknown key (see decoder).
func (b *Backend) decodeNode(d *decoder, n *yaml.Node, at string) {
	b.failed = true // until a section decodes
	if n.Kind != yaml.MappingNode {
		d.fail(n, at, "give one backend section, e.g. exec: {create: [...], stop: [...]}")
		return
	}
	before := len(d.errs)
	kind, sections := b.sections(d, n, at)
	switch {
	case len(sections) == 0 && len(d.errs) > before:
		return // a misspelt section, reported with its suggestion
	case len(sections) > 1:
		names := make([]string, 0, len(sections))
		for _, s := range sections {
			names = append(names, s.Value)
		}
		d.fail(sections[1], at, fmt.Sprintf("%s sections given: an agent runs one backend; keep one", strings.Join(names, " and ")))
		b.decodeNamed(d, kind, sections, n, at)
		return
	case len(sections) == 0 && kind == "":
		d.fail(n, at, "no backend section: give one of "+strings.Join(backend.Kinds(), ", "))
		return
	case len(sections) == 1 && kind != "" && kind != sections[0].Value:
		d.fail(sections[0], at, fmt.Sprintf("kind is %s but the section is %s: keep one backend, and kind (optional) naming it", kind, sections[0].Value))
		return
	}
	var body *yaml.Node
	if len(sections) == 1 {
		kind, body = sections[0].Value, valueOf(n, sections[0])
	}
	b.decodeKind(d, kind, body, n, at)
}

// sections splits the mapping into the optional kind key and the keys that
// name registered backends; any other key is refused with a suggestion.
func (b *Backend) sections(d *decoder, n *yaml.Node, at string) (kind string, sections []*yaml.Node) {
	known := append([]string{"kind"}, backend.Kinds()...)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch _, ok := backend.Lookup(k.Value); {
		case k.Value == "kind":
			if v.Kind != yaml.ScalarNode {
				d.fail(v, at+".kind", "give a backend name: "+strings.Join(backend.Kinds(), ", "))
				continue
			}
			kind = v.Value
			if _, ok := backend.Lookup(kind); !ok {
				d.unknown(v, at+".kind", kind, backend.Kinds(), fmt.Sprintf("%q: not a backend", kind))
				kind = ""
			}
		case ok:
			sections = append(sections, k)
		default:
			d.unknown(k, at+"."+k.Value, k.Value, known, "unknown key")
		}
	}
	return kind, sections
}

// decodeNamed still decodes (and so validates) the section kind names
// when several are given, so that one run reports its mistakes too.
func (b *Backend) decodeNamed(d *decoder, kind string, sections []*yaml.Node, n *yaml.Node, at string) {
	for _, s := range sections {
		if s.Value == kind {
			b.decodeKind(d, kind, valueOf(n, s), n, at)
			b.failed = false
		}
	}
}

// valueOf returns the value node of key k in mapping n.
func valueOf(n, k *yaml.Node) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i] == k {
			return n.Content[i+1]
		}
	}
	return nil
}

// decodeKind decodes body (nil: an empty section) into kind's settings.
func (b *Backend) decodeKind(d *decoder, kind string, body, parent *yaml.Node, at string) {
	k, _ := backend.Lookup(kind)
	s := k.NewSettings()
	if body != nil {
		d.decode(body, reflect.ValueOf(s).Elem(), at+"."+kind)
	} else {
		d.lines[at+"."+kind] = parent.Line
	}
	b.Kind, b.Settings, b.failed = kind, s, false
}

// defaults fills the step deadlines with the kind's and the rest with the
// backend's own defaults.
func (b *Backend) defaults(h backend.Host) {
	if b.Settings == nil {
		return
	}
	def := backend.DefaultSteps
	if k, ok := backend.Lookup(b.Kind); ok {
		def = k.Steps
		b.Settings.Defaults(h)
	}
	b.Settings.StepDeadlines().Default(def)
}

// validate reports a missing or unknown kind, or the section's own problems.
func (b *Backend) validate(at string, h backend.Host, bad backend.Report) {
	if b.failed {
		return // reported where it failed
	}
	if _, ok := backend.Lookup(b.Kind); !ok || b.Settings == nil {
		bad("%s: backend %q: give one section of %s", at, b.Kind, strings.Join(backend.Kinds(), ", "))
		return
	}
	b.Settings.Validate(at+"."+b.Kind, h, bad)
}
