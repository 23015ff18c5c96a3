package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is one mistake in a config file, placed where the operator finds
// it: "berth.yaml:12: watchdog.provison_timeout: unknown key; did you mean
// provision_timeout?". Load and Parse return every mistake at once, joined
// (errors.Join); errors.As finds the first.
type Error struct {
	File string // empty for Parse
	Line int    // 0 when the key is not in the file (a missing setting)
	Key  string // the full dotted path, e.g. agents[0].backend.exec.create
	Msg  string // what is wrong and what to change
	// Suggest is the nearest known key, for an unknown one ("" if none).
	Suggest string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File + ":")
	}
	if e.Line > 0 {
		b.WriteString(strconv.Itoa(e.Line) + ":")
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	if e.Key != "" && !strings.HasPrefix(e.Msg, e.Key) {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	if e.Suggest != "" {
		b.WriteString("; did you mean " + e.Suggest + "?")
	}
	return b.String()
}

// nodeDecoder is a type that reads its own YAML section (Backend).
type nodeDecoder interface {
	decodeNode(d *decoder, n *yaml.Node, at string)
}

// decoder walks a YAML tree beside the Go value it fills, so that every
// unknown key, wrong type and negative duration is reported with its line
// and dotted path (yaml's KnownFields stops at the first and names neither).
type decoder struct {
	errs  []error
	lines map[string]int // dotted path → line, to place Validate's errors
}

var durationType = reflect.TypeOf(time.Duration(0))

func (d *decoder) fail(n *yaml.Node, at, msg string) {
	d.errs = append(d.errs, &Error{Line: n.Line, Key: at, Msg: msg})
}

// unknown reports key at path at, suggesting the nearest of known.
func (d *decoder) unknown(n *yaml.Node, at, key string, known []string, msg string) {
	e := &Error{Line: n.Line, Key: at, Msg: msg, Suggest: nearest(key, known)}
	if e.Suggest == "" && len(known) > 0 {
		e.Msg += " (known here: " + strings.Join(known, ", ") + ")"
	}
	d.errs = append(d.errs, e)
}

// decode fills v from n; at is n's dotted path ("" at the top).
func (d *decoder) decode(n *yaml.Node, v reflect.Value, at string) {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) > 0 {
			d.decode(n.Content[0], v, at)
		}
		return
	}
	d.lines[at] = n.Line
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // `key:` with nothing: the default
	}
	if nd, ok := v.Addr().Interface().(nodeDecoder); ok {
		nd.decodeNode(d, n, at)
		return
	}
	switch {
	case v.Kind() == reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		d.decode(n, v.Elem(), at)
	case v.Kind() == reflect.Struct:
		d.decodeStruct(n, v, at)
	case v.Kind() == reflect.Map && hasStruct(v.Type().Elem()):
		d.decodeMap(n, v, at)
	case v.Kind() == reflect.Slice && hasStruct(v.Type().Elem()):
		d.decodeSlice(n, v, at)
	default:
		d.decodeLeaf(n, v, at)
	}
}

// hasStruct reports whether t holds keys of its own to check.
func hasStruct(t reflect.Type) bool {
	return t.Kind() == reflect.Struct || (t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct)
}

// decodeStruct checks each key against v's yaml tags (inline structs
// included) before decoding its value.
func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, at string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, at, "give a section of key: value lines here, not "+describe(n))
		return
	}
	fields := map[string]reflect.Value{}
	collectFields(v, fields)
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		path := join(at, k.Value)
		f, ok := fields[k.Value]
		switch {
		case !ok:
			d.unknown(k, path, k.Value, sortedKeys(fields), "unknown key")
		case seen[k.Value]:
			d.fail(k, path, "given twice; keep one")
		default:
			seen[k.Value] = true
			d.decode(val, f, path)
		}
	}
}

// collectFields maps yaml key → field of v, through inline structs.
func collectFields(v reflect.Value, out map[string]reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case strings.Contains(opts, "inline"):
			collectFields(v.Field(i), out)
		case name != "":
			out[name] = v.Field(i)
		}
	}
}

// decodeMap decodes a mapping of sections (pools, warm_pools) entry by
// entry, so that each entry's keys are checked too.
func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, at string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, at, "give a section of name: {...} entries here, not "+describe(n))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := reflect.New(v.Type().Key()).Elem()
		if err := k.Decode(key.Addr().Interface()); err != nil {
			d.fail(k, join(at, k.Value), yamlMessage(err))
			continue
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(val, elem, join(at, k.Value))
		v.SetMapIndex(key, elem)
	}
}

// decodeSlice decodes a list of sections (agents, schedule) item by item.
func (d *decoder) decodeSlice(n *yaml.Node, v reflect.Value, at string) {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, at, "give a list (lines starting with - ) here, not "+describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", at, i))
	}
	v.Set(s)
}

// decodeLeaf decodes a value with no keys of its own (a number, a
// duration, a list of strings) and refuses a negative duration: no setting
// of Berth's means anything by one.
func (d *decoder) decodeLeaf(n *yaml.Node, v reflect.Value, at string) {
	if err := n.Decode(v.Addr().Interface()); err != nil {
		d.fail(n, at, wantFor(v.Type(), n, err))
		return
	}
	if v.Type() == durationType && v.Int() < 0 {
		d.fail(n, at, fmt.Sprintf("%v is negative: give a positive duration such as 90s or 10m", time.Duration(v.Int())))
	}
}

// wantFor says what a value of type t looks like, for a wrong type.
func wantFor(t reflect.Type, n *yaml.Node, err error) string {
	got := describe(n)
	switch {
	case t == durationType:
		return got + " is not a duration: give one such as 90s, 10m or 2h"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 && t.Name() != "Size":
		return got + " is not a whole number"
	case t.Kind() == reflect.Bool:
		return got + ": give true or false"
	case t.Kind() == reflect.Slice:
		return got + ": give a list, e.g. [a, b]"
	case t.Kind() == reflect.Map:
		return got + ": give a section of key: value lines"
	}
	return yamlMessage(err)
}

// describe names a node for an error: its value, or its shape.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a section"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// lineRE strips yaml's own "line N: " from messages the decoder places.
var lineRE = regexp.MustCompile(`^(yaml: )?(unmarshal errors:\s*)?(line \d+: )?`)

func yamlMessage(err error) string { return lineRE.ReplaceAllString(err.Error(), "") }

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

func sortedKeys(m map[string]reflect.Value) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// nearest is the known key closest to key by edit distance, if it is
// close enough to be a slip (a third of the key's length, at least 2);
// "" otherwise.
func nearest(key string, known []string) string {
	best, bestD := "", max(2, len(key)/3)+1
	for _, k := range known {
		if dist := editDistance(key, k); dist < bestD {
			best, bestD = k, dist
		}
	}
	return best
}

// editDistance is the optimal-string-alignment distance between a and b:
// insertions, deletions, substitutions and swaps of neighbours each count
// one, since a swapped pair of letters is the commonest slip.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// keyRE finds the dotted key a Validate message starts with.
var keyRE = regexp.MustCompile(`^[a-z_]+(\[\d+\])?(\.[^ :.\[]+(\[\d+\])?)*`)

// placed turns Validate's errors into Errors at the line of the key each
// starts with (or of its nearest parent in the file).
func placed(err error, lines map[string]int) []error {
	var out []error
	for _, e := range unjoin(err) {
		msg := e.Error()
		key := keyRE.FindString(msg)
		line, ok := 0, false
		for k := key; k != "" && !ok; k = parent(k) {
			line, ok = lines[k]
		}
		out = append(out, &Error{Line: line, Key: key, Msg: msg})
	}
	return out
}

// parent drops the last segment of a dotted path ("" at the top).
func parent(k string) string {
	if i := strings.LastIndexAny(k, ".["); i > 0 {
		return k[:i]
	}
	return ""
}

// unjoin lists the errors errors.Join put together.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// inFile names the file in every error of errs.
func inFile(path string, errs []error) error {
	for _, e := range errs {
		var ce *Error
		if errors.As(e, &ce) {
			ce.File = path
		}
	}
	return errors.Join(errs...)
}

// yamlLineRE finds the line a YAML syntax error names.
var yamlLineRE = regexp.MustCompile(`line (\d+)`)

// yamlLine is the line of a syntax error, 0 if yaml names none.
func yamlLine(err error) int {
	m := yamlLineRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// decodeNode reads dispatcher.github: one section, or a list of them
// whose first entry is the default installation (GitHub.More holds the
// rest).
func (g *GitHub) decodeNode(d *decoder, n *yaml.Node, at string) {
	if n.Kind != yaml.SequenceNode {
		d.decodeStruct(n, reflect.ValueOf(g).Elem(), at)
		return
	}
	if len(n.Content) == 0 {
		d.fail(n, at, "give at least one installation, or leave github out")
		return
	}
	for i, item := range n.Content {
		entry := g
		if i > 0 {
			g.More = append(g.More, GitHub{})
			entry = &g.More[len(g.More)-1]
		}
		d.decodeStruct(item, reflect.ValueOf(entry).Elem(), fmt.Sprintf("%s[%d]", at, i))
	}
}
