package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Record is one log line the code under test wrote: its level, message
// and attributes (groups flattened to "group.key"; values as slog.Value
// strings).
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// Recorder keeps every record written through the logger Logs returns.
// It is safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	recs []Record
}

// Logs returns a logger (all levels, Debug up) whose output the Recorder
// keeps. Lines are not passed to t.Log (code under test may log after the
// test ends); a failing test prints Recorder.String, and when t fails the
// records are logged at cleanup.
func Logs(t testing.TB) (*slog.Logger, *Recorder) {
	r := &Recorder{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", r)
		}
	})
	return slog.New(&recordHandler{r: r}), r
}

// Records is every record so far, in order (a copy).
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.recs...)
}

// Count is how many records have message msg and every given attribute;
// attrs alternate key and value ("job", 7, "pool", "linux"), values compared
// by their fmt "%v" form.
func (r *Recorder) Count(msg string, attrs ...any) int {
	want := pairs(attrs)
	n := 0
	for _, rec := range r.Records() {
		if rec.Msg != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if rec.Attrs[k] != v {
				ok = false
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// Has reports whether a record has message msg and every given attribute
// (see Count).
func (r *Recorder) Has(msg string, attrs ...any) bool { return r.Count(msg, attrs...) > 0 }

// String is every record, one a line, for a failure message.
func (r *Recorder) String() string {
	var b strings.Builder
	for _, rec := range r.Records() {
		fmt.Fprintf(&b, "%s %q %v\n", rec.Level, rec.Msg, rec.Attrs)
	}
	return b.String()
}

func pairs(kv []any) map[string]string {
	out := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[fmt.Sprint(kv[i])] = fmt.Sprint(kv[i+1])
	}
	if len(kv)%2 == 1 {
		out[fmt.Sprint(kv[len(kv)-1])] = "!MISSING"
	}
	return out
}

type recordHandler struct {
	r      *Recorder
	attrs  []slog.Attr
	prefix string // open groups, "a.b."
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]string{}
	for _, a := range h.attrs {
		flatten(attrs, "", a)
	}
	rec.Attrs(func(a slog.Attr) bool {
		flatten(attrs, h.prefix, a)
		return true
	})
	h.r.mu.Lock()
	h.r.recs = append(h.r.recs, Record{Level: rec.Level, Msg: rec.Message, Attrs: attrs})
	h.r.mu.Unlock()
	return nil
}

func (h *recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		if h.prefix != "" {
			a.Key = h.prefix + a.Key
		}
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *recordHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + name + "."
	return &c
}

func flatten(into map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			flatten(into, p, g)
		}
		return
	}
	into[prefix+a.Key] = v.String()
}
