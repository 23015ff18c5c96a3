package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Filter narrows `berth events` to one aggregate.
type Filter struct {
	Job     int64
	Pool    string
	Host    string
	Attempt string
}

// Validate refuses filters that name two aggregates at once (a job and a
// pool, say): their facts live on different subjects, so no fact is in both.
// A host may narrow an attempt.
func (f Filter) Validate() error {
	var named []string
	if f.Job != 0 {
		named = append(named, "--job")
	}
	if f.Pool != "" {
		named = append(named, "--pool")
	}
	if f.Host != "" && f.Attempt == "" {
		named = append(named, "--host")
	}
	if f.Attempt != "" {
		named = append(named, "--attempt")
	}
	if len(named) > 1 {
		return fmt.Errorf("%s name different aggregates and no fact belongs to both: give one (--host may narrow --attempt)", strings.Join(named, " and "))
	}
	return nil
}

// Subjects turns the filter into NATS subject filters (the same ones an
// operator would give `nats sub`).
func (f Filter) Subjects() []string {
	switch {
	case f.Attempt != "":
		h := f.Host
		if h == "" {
			h = "*"
		}
		return []string{events.AttemptFilter(h, f.Attempt)}
	case f.Job != 0:
		return []string{events.JobSubject(f.Job)}
	case f.Host != "":
		return []string{events.HostFilter(f.Host), events.HostAttemptsFilter(f.Host)}
	case f.Pool != "":
		return []string{events.PoolFilter(f.Pool), events.DemandSubject(f.Pool), events.AlarmSubject(f.Pool)}
	}
	return []string{events.SubjectAll}
}

// Tail prints the log from the start (follow: and then as it grows) in
// human form or as one CloudEvents JSON envelope per line.
func Tail(ctx context.Context, js jetstream.JetStream, f Filter, follow, asJSON bool, w io.Writer) error {
	last, err := eventlog.LastSeq(ctx, js)
	if err != nil {
		return err
	}
	if !follow {
		// A filter that matches nothing delivers nothing: count first, so
		// the command ends instead of waiting for a first message.
		n, err := countMatching(ctx, js, f.Subjects())
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan eventlog.Delivered, 256)
	errc := make(chan error, 1)
	go func() { errc <- eventlog.Follow(ctx, js, f.Subjects(), 1, ch) }()
	if last == 0 && !follow {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case d := <-ch:
			if err := printEvent(w, d, asJSON); err != nil {
				return err
			}
			if !follow && (d.Pending == 0 || d.Event.Seq >= last) {
				return nil
			}
		}
	}
}

func countMatching(ctx context.Context, js jetstream.JetStream, filters []string) (uint64, error) {
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, filter := range filters {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return 0, err
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n, nil
}

func printEvent(w io.Writer, d eventlog.Delivered, asJSON bool) error {
	if d.Err != nil {
		_, err := fmt.Fprintf(w, "%8d  (skipped: %v)\n", d.Event.Seq, d.Err)
		return err
	}
	if asJSON {
		b, err := events.Marshal(d.Event)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	data, _ := json.Marshal(d.Event.Data)
	short := strings.TrimSuffix(strings.TrimPrefix(d.Event.Type(), "berth."), ".v1")
	_, err := fmt.Fprintf(w, "%8d  %s  %-28s %-44s %s\n", d.Event.Seq, d.Event.Time.Format("15:04:05.000"), short, d.Event.Subject, redact(data))
	return err
}

// redact hides sealed secrets in human output (they are sealed, but long).
func redact(b []byte) string {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return string(b)
	}
	if _, ok := m["sealed_jit"]; ok {
		m["sealed_jit"] = "<sealed>"
	}
	out, _ := json.Marshal(m)
	return string(out)
}
