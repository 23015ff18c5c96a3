package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

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

// followEvery is how often a following Tail asks for what was stored
// since its last look.
const followEvery = 250 * time.Millisecond

// Tail prints the log from the start (follow: and then as it grows) in
// human form or as one CloudEvents JSON envelope per line. It reads with
// batched direct gets (eventlog.Scan), so it needs no consumer and no right
// to make one: the cli role holds none.
// When following a named aggregate the log has no fact of yet, it says on
// note that it waits (a silent terminal looked like a hang, or a typo).
func Tail(ctx context.Context, js jetstream.JetStream, f Filter, follow, asJSON bool, w, note io.Writer) error {
	filters := f.Subjects()
	next := make([]uint64, len(filters))
	for first := true; ; first = false {
		n, err := tailOnce(ctx, js, filters, next, asJSON, w)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !follow {
			if n == 0 {
				return f.nothing()
			}
			return nil
		}
		if first && n == 0 {
			if err := f.nothing(); err != nil {
				fmt.Fprintf(note, "berth events: %v\nwaiting for its first fact (Ctrl-C stops)\n", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followEvery):
		}
	}
}

// tailOnce prints what each filter matches from next[i] on, merged in log
// order, and moves next on. One filter prints as it reads; several (a
// pool's ledger, demand and alarms) are merged by sequence.
func tailOnce(ctx context.Context, js jetstream.JetStream, filters []string, next []uint64, asJSON bool, w io.Writer) (int, error) {
	printed := 0
	if len(filters) == 1 {
		n, err := eventlog.Scan(ctx, js, filters[0], next[0], 0, func(d eventlog.Delivered) error {
			printed++
			return printEvent(w, d, asJSON)
		})
		next[0] = n
		return printed, err
	}
	var batch []eventlog.Delivered
	for i, flt := range filters {
		n, err := eventlog.Scan(ctx, js, flt, next[i], 0, func(d eventlog.Delivered) error {
			batch = append(batch, d)
			return nil
		})
		next[i] = n
		if err != nil {
			return 0, err
		}
	}
	sort.Slice(batch, func(a, b int) bool { return batch[a].Event.Seq < batch[b].Event.Seq })
	for _, d := range batch {
		if err := printEvent(w, d, asJSON); err != nil {
			return 0, err
		}
	}
	return len(batch), nil
}

// ErrNoFacts: a filter that names a job, pool, host or attempt matched no
// fact in the log (a typo, or its facts are past the stream's max_age).
var ErrNoFacts = errors.New("no fact in the log")

// nothing is what an empty answer means: nil for the whole log (it may be
// empty), ErrNoFacts, saying where to look, for a named aggregate.
func (f Filter) nothing() error {
	var what, list string
	switch {
	case f.Attempt != "":
		what, list = "attempt "+f.Attempt, "berth status lists the attempts holding slots, and berth events --job ID shows which attempt took a job (a warm VM's, or another job's runner, may have)"
	case f.Job != 0:
		what, list = fmt.Sprintf("job %d", f.Job), "berth jobs lists the jobs the log holds, newest first (--limit 0: all of them)"
	case f.Host != "":
		what, list = "host "+f.Host, "berth hosts lists the hosts"
	case f.Pool != "":
		what, list = "pool "+f.Pool, "berth status lists the pools"
	default:
		return nil
	}
	return fmt.Errorf("%w for %s (%s): a typo, or its facts are past the stream's max_age; %s",
		ErrNoFacts, what, strings.Join(f.Subjects(), ", "), list)
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
