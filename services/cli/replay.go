package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Progress returns the progress callback of a new ProgressBar on w.
func Progress(w io.Writer) func(done, total uint64) { return NewProgress(w).Update }

// ProgressBar shows a replay's progress on w (stderr). On a terminal it
// redraws one line: a bar, facts folded of the total, percent and rate; on
// anything else (a file, a pipe, TERM=dumb) it prints a plain line every
// PlainEvery, so logs stay readable. Done finishes it.
type ProgressBar struct {
	w     io.Writer
	tty   bool
	now   func() time.Time
	start time.Time
	last  time.Time // of the last line drawn
	drawn bool      // a terminal line is on screen
	done  uint64
	total uint64
}

// PlainEvery is how often a ProgressBar prints a line when w is not a
// terminal; RedrawEvery how often it redraws the line on a terminal.
const (
	PlainEvery  = 5 * time.Second
	RedrawEvery = 100 * time.Millisecond
)

// NewProgress returns a bar drawn on w, redrawn in place when w is a
// terminal.
func NewProgress(w io.Writer) *ProgressBar { return NewProgressOn(w, isTerminal(w), time.Now) }

// NewProgressOn is NewProgress with the terminal test and the clock given.
func NewProgressOn(w io.Writer, tty bool, now func() time.Time) *ProgressBar {
	return &ProgressBar{w: w, tty: tty, now: now}
}

// isTerminal reports whether w is a character device, and TERM allows
// redrawing a line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Update records that done of total facts are folded, and draws when it is
// time to.
func (p *ProgressBar) Update(done, total uint64) {
	now := p.now()
	if p.start.IsZero() {
		p.start, p.last = now, now
	}
	p.done, p.total = done, total
	every := PlainEvery
	if p.tty {
		every = RedrawEvery
	}
	if now.Sub(p.last) < every {
		return
	}
	p.last = now
	p.draw(now)
}

// Done finishes the bar: on a terminal it clears the line (the result
// follows on stdout, which is often the same terminal); otherwise it
// prints a last line if any was printed, so the log shows the end.
func (p *ProgressBar) Done() {
	if p.tty {
		if p.drawn {
			fmt.Fprint(p.w, "\r\x1b[K")
		}
		p.start, p.drawn = time.Time{}, false
		return
	}
	if p.drawn {
		p.draw(p.now())
	}
	p.start, p.drawn = time.Time{}, false
}

const barWidth = 30

func (p *ProgressBar) draw(now time.Time) {
	p.drawn = true
	pct := float64(100)
	if p.total > 0 {
		pct = float64(min(p.done, p.total)) * 100 / float64(p.total)
	}
	rate := ""
	if el := now.Sub(p.start).Seconds(); el > 0 {
		rate = fmt.Sprintf(", %s facts/s", commas(uint64(float64(p.done)/el)))
	}
	if !p.tty {
		fmt.Fprintf(p.w, "replaying: %s of %s facts (%.0f%%%s)\n", commas(p.done), commas(p.total), pct, rate)
		return
	}
	fill := int(pct * barWidth / 100)
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", barWidth-fill)
	if fill > 0 && fill < barWidth {
		bar = bar[:fill-1] + ">" + bar[fill:]
	}
	fmt.Fprintf(p.w, "\rreplaying [%s] %s/%s %3.0f%%%s\x1b[K", bar, commas(p.done), commas(p.total), pct, rate)
}

// commas prints n with thousands separators: 1234567 → 1,234,567.
func commas(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// Replayed is a fleet rebuilt from the log, and what the rebuild started
// from (the log's first sequence, and the snapshot when old facts expired).
type Replayed struct {
	Status     events.Status
	Violations []events.Violation
	Base       eventlog.ReplayBase
}

// Replay rebuilds the fleet from the log as of a sequence (0: the end) or
// a time (zero: no limit); once old facts have expired it starts from the
// newest snapshot that covers them (eventlog.ReplayFrom), and fails with
// eventlog.ErrTruncated, saying what is missing, when none does.
func Replay(ctx context.Context, js jetstream.JetStream, seq uint64, at time.Time, progress func(done, total uint64)) (Replayed, error) {
	f, base, err := eventlog.ReplayFrom(ctx, js, seq, at, progress)
	if err != nil {
		return Replayed{Base: base}, err
	}
	return Replayed{Status: f.Status(), Violations: f.Check(), Base: base}, nil
}

// ReplayStatus is Replay without the base.
func ReplayStatus(ctx context.Context, js jetstream.JetStream, seq uint64, at time.Time, progress func(done, total uint64)) (events.Status, []events.Violation, error) {
	r, err := Replay(ctx, js, seq, at, progress)
	return r.Status, r.Violations, err
}

// Note says, for an operator, what a replay started from when old facts
// had expired ("" when it folded the whole log).
func (b Replayed) Note() string {
	if b.Base.Snapshot == "" {
		return ""
	}
	return fmt.Sprintf("note: facts before seq %d have expired; this replay starts from the %s's snapshot at seq %d "+
		"(terminal jobs and attempts older than the services' retention are not in it) and folds the log after it",
		b.Base.FirstSeq, b.Base.Snapshot, b.Base.SnapshotSeq)
}

// Check compares a running service's live projection (GET url/status) with
// a fresh replay of the log up to the same sequence, and returns every
// difference as "path: live X, replay Y". url may be host:port (http is
// meant), as the demo and the README print the services' addresses.
func Check(ctx context.Context, js jetstream.JetStream, url string, progress func(done, total uint64)) ([]string, uint64, error) {
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/status", nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s/status: %w (is the service running? pass its address with --service URL, once per service)", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("%s/status answered %s", url, resp.Status)
	}
	var live events.Status
	if err := json.NewDecoder(resp.Body).Decode(&live); err != nil {
		return nil, 0, fmt.Errorf("decode %s/status: %w", url, err)
	}
	replayed, _, err := ReplayStatus(ctx, js, live.AsOfSeq, time.Time{}, progress)
	if err != nil {
		return nil, 0, err
	}
	return diff("", toTree(live), toTree(replayed)), live.AsOfSeq, nil
}

func toTree(st events.Status) any {
	b, _ := json.Marshal(st)
	var v any
	_ = json.Unmarshal(b, &v)
	return v
}

// diff lists where two JSON trees differ; lists of named items (pools,
// hosts, alarms) are matched by name or key.
func diff(path string, a, b any) []string {
	if reflect.DeepEqual(a, b) {
		return nil
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			out = append(out, diff(path+"."+k, am[k], bm[k])...)
		}
		return out
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok {
		an, bn := byName(al), byName(bl)
		if an != nil && bn != nil {
			keys := map[string]bool{}
			for k := range an {
				keys[k] = true
			}
			for k := range bn {
				keys[k] = true
			}
			var out []string
			for _, k := range sortedKeys(keys) {
				out = append(out, diff(path+"["+k+"]", an[k], bn[k])...)
			}
			return out
		}
	}
	la, _ := json.Marshal(a)
	lb, _ := json.Marshal(b)
	return []string{fmt.Sprintf("%s: live %s, replay %s", strings.TrimPrefix(path, "."), la, lb)}
}

func byName(l []any) map[string]any {
	out := map[string]any{}
	for _, v := range l {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		var name string
		for _, k := range []string{"name", "key", "attempt"} {
			if s, ok := m[k].(string); ok {
				name = s
				break
			}
		}
		if name == "" {
			return nil
		}
		out[name] = v
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
