package page

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxTimeline caps the facts one job's timeline reads from the log.
const MaxTimeline = 500

// Fact is one stored fact of a job's timeline, as the page shows it.
type Fact struct {
	Seq     uint64
	Time    time.Time
	Type    string // short: "job.queued", "attempt.placed"
	Attempt string // "" for the job's own facts
	Host    string
	Author  string // the role the subject names (law 10)
	Detail  string // the payload's allowlisted fields (detailKeys)
}

// AttemptOutcome is one attempt of the job as the fold sums it up.
type AttemptOutcome struct {
	ID, Pool, Host string
	Outcome        string
}

// Timeline is one job's page.
type Timeline struct {
	Job      JobRow
	Attempts []AttemptOutcome
	Facts    []Fact
	// Truncated: the job has more than MaxTimeline facts; the first are shown.
	Truncated bool
}

// detailKeys are the payload fields a timeline shows, in this order:
// never a sealed JIT config, a delivery id or a label set's payload.
var detailKeys = []string{"conclusion", "runner_name", "bound_job_id", "step", "reason", "culprit", "error", "late", "ended", "took_ns"}

// where is what of the log a job's timeline reads: the subjects of its
// own facts and its attempts', and its slot facts by sequence (they stand
// on the pool's subject, among every job's, so a scan of it would read
// the whole pool's history).
type where struct {
	filters []string
	slots   []at
}

// at is one stored fact: its sequence and the filter it must match.
type at struct {
	filter string
	seq    uint64
}

// attemptsOf is where job's facts are (its own subject, each of its
// attempts', and each attempt's booking, claim and release), with what the
// fold says of each attempt.
func attemptsOf(f *events.Fleet, job int64) (where, []AttemptOutcome) {
	w := where{filters: []string{events.JobSubject(job)}}
	var out []AttemptOutcome
	for _, a := range f.Attempts {
		if a.JobID != job && a.BoundJobID != job {
			continue
		}
		out = append(out, AttemptOutcome{ID: a.ID, Pool: a.Pool, Host: a.Host, Outcome: outcome(a)})
		if a.Host != "" {
			w.filters = append(w.filters, events.AttemptFilter(a.Host, a.ID))
		}
		for _, seq := range []uint64{a.ReservedSeq, a.BookedSeq, a.ReleasedSeq} {
			if seq != 0 && !slices.ContainsFunc(w.slots, func(x at) bool { return x.seq == seq }) {
				w.slots = append(w.slots, at{filter: events.PoolFilter(a.Pool), seq: seq})
			}
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].ID < out[k].ID })
	return w, out
}

// outcome is an attempt's state in words, from the fold.
func outcome(a *events.Attempt) string {
	var parts []string
	switch {
	case a.Released:
		r := "slot released: " + a.ReleaseReason
		if a.ReleaseCulprit != "" {
			r += " (charged to " + a.ReleaseCulprit + ")"
		}
		parts = append(parts, r)
	case a.Reserved:
		parts = append(parts, "slot held")
	}
	if a.Failed {
		c := a.FailedCulprit
		if c == "" {
			c = "host"
		}
		parts = append(parts, fmt.Sprintf("%s failed (charged to %s)", a.FailedStep, c))
	}
	switch {
	case a.Abandoned && !a.Stopped:
		parts = append(parts, "VM abandoned in "+a.AbandonedStep)
	case a.Stopped:
		parts = append(parts, "VM stopped")
	case a.TeardownReq:
		parts = append(parts, "teardown asked: "+a.TeardownReason)
	case a.RunnerStarted:
		parts = append(parts, "runner started")
	case a.Provisioning:
		parts = append(parts, "provisioning")
	}
	return strings.Join(parts, "; ")
}

// readFacts reads the facts w names from the log, in log order, at
// most MaxTimeline, with batched direct gets (eventlog.Scan, what `berth
// events --job` reads): no consumer, which the dispatcher's permissions
// grant only under its own name. It says whether more were left.
func readFacts(ctx context.Context, js jetstream.JetStream, w where) ([]Fact, bool, error) {
	var all []events.Event
	for _, s := range w.slots {
		d, err := eventlog.At(ctx, js, s.filter, s.seq)
		switch {
		case errors.Is(err, eventlog.ErrNotAt):
			continue // expired: the attempt's outcome still says it
		case err != nil:
			return nil, false, fmt.Errorf("read the job's slot facts: %w", err)
		case d.Err == nil:
			all = append(all, d.Event)
		}
	}
	for _, filter := range w.filters {
		if _, err := eventlog.Scan(ctx, js, filter, 1, 0, func(d eventlog.Delivered) error {
			if d.Err == nil {
				all = append(all, d.Event)
			}
			return nil
		}); err != nil {
			return nil, false, fmt.Errorf("read the job's facts: %w", err)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Seq < all[j].Seq })
	more := len(all) > MaxTimeline
	if more {
		all = all[:MaxTimeline]
	}
	out := make([]Fact, len(all))
	for i, e := range all {
		out[i] = factOf(e)
	}
	return out, more, nil
}

// factOf is e as a timeline row: where it stands (from its subject) and
// its allowlisted fields.
func factOf(e events.Event) Fact {
	f := Fact{Seq: e.Seq, Time: e.Time, Type: strings.TrimSuffix(strings.TrimPrefix(e.Type(), "berth."), ".v1")}
	// berth.evt.attempt.<host>.<attempt>.<author>, berth.evt.job.<id>
	parts := strings.Split(strings.TrimPrefix(e.Subject, events.SubjectPrefix+"."), ".")
	if len(parts) == 4 && parts[0] == "attempt" {
		f.Host, f.Attempt = parts[1], parts[2]
	}
	f.Author = string(events.AuthorOf(e.Subject))
	b, err := json.Marshal(e.Data)
	if err != nil {
		return f
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // ids stay ids, not 1.2e+06
	if dec.Decode(&m) != nil {
		return f
	}
	// A slot fact stands on its pool's subject; its payload names the
	// attempt and host (the ledger's author, the dispatcher, confirmed
	// them when it booked).
	if f.Attempt == "" {
		f.Attempt, _ = m["attempt"].(string)
		f.Host, _ = m["host"].(string)
	}
	var d []string
	for _, k := range detailKeys {
		v, ok := m[k]
		if !ok || v == "" || v == nil || v == false {
			continue
		}
		if k == "took_ns" {
			if n, ok := v.(json.Number); ok {
				if ns, err := n.Int64(); err == nil {
					v = time.Duration(ns).Round(time.Millisecond)
				}
			}
			k = "took"
		}
		d = append(d, fmt.Sprintf("%s=%v", k, v))
	}
	f.Detail = strings.Join(d, " ")
	return f
}
