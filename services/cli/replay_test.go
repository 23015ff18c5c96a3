package cli_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// newClock is a fake clock the test moves by hand.
func newClock() *clock.Fake { return clock.NewFake(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)) }

func lines(s string) []string              { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }
func hasAny(s string, subs ...string) bool { return strings.ContainsAny(s, strings.Join(subs, "")) }

// Given a terminal, the progress bar redraws one line (no newline) at most
// every RedrawEvery, with a bar, the count, the percent and the rate, and
// Done clears the line for the result.
func TestProgressBarOnATerminalRedrawsOneLine(t *testing.T) {
	var out bytes.Buffer
	c := newClock()
	bar := cli.NewProgressOn(&out, true, c.Now)
	bar.Update(0, 200_000)
	c.Advance(10 * time.Millisecond)
	bar.Update(1_000, 200_000)
	if out.Len() != 0 {
		t.Fatalf("drew %q within %v of the start", out.String(), cli.RedrawEvery)
	}
	c.Advance(2 * time.Second)
	bar.Update(100_000, 200_000)
	got := out.String()
	want := "\rreplaying [==============>               ] 100,000/200,000  50%, 49,751 facts/s\x1b[K"
	if got != want {
		t.Errorf("drew\n %q\nwant\n %q", got, want)
	}
	c.Advance(cli.RedrawEvery)
	bar.Update(200_000, 200_000)
	if !strings.Contains(out.String(), "[==============================] 200,000/200,000 100%") {
		t.Errorf("full bar not drawn: %q", out.String())
	}
	bar.Done()
	if s := out.String(); strings.Contains(s, "\n") || !strings.HasSuffix(s, "\r\x1b[K") || strings.Count(s, "\r") != 3 {
		t.Errorf("terminal output %q: want redraws of one line and a clear at the end, no newline", s)
	}
}

// Given a pipe or file, the progress is a plain line every PlainEvery and a
// last line at the end, without carriage returns or escape codes; a replay
// shorter than PlainEvery prints nothing.
func TestProgressOffATerminalPrintsPlainLines(t *testing.T) {
	var out bytes.Buffer
	c := newClock()
	bar := cli.NewProgressOn(&out, false, c.Now)
	for i := range 13 {
		bar.Update(uint64(i)*1000, 12_000)
		c.Advance(time.Second)
	}
	bar.Done()
	got := lines(out.String())
	want := []string{
		"replaying: 5,000 of 12,000 facts (42%, 1,000 facts/s)",
		"replaying: 10,000 of 12,000 facts (83%, 1,000 facts/s)",
		"replaying: 12,000 of 12,000 facts (100%, 923 facts/s)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if hasAny(out.String(), "\r", "\x1b") {
		t.Errorf("plain output has terminal controls: %q", out.String())
	}

	out.Reset()
	short := cli.NewProgressOn(&out, false, c.Now)
	short.Update(10, 10)
	short.Done()
	if out.Len() != 0 {
		t.Errorf("a short replay printed %q", out.String())
	}
}

// A buffer or a regular file is not a terminal.
func TestProgressDetectsNonTerminals(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "progress"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, w := range []interface{ Write([]byte) (int, error) }{&bytes.Buffer{}, f} {
		bar := cli.NewProgress(w)
		bar.Update(0, 10)
		bar.Done()
	}
	if st, _ := f.Stat(); st.Size() != 0 {
		t.Errorf("a short replay wrote %d bytes to a file", st.Size())
	}
}

// Given a log whose oldest facts expired (the host's online fact among
// them), when `berth replay` runs, then it starts from the dispatcher's
// snapshot, says so, and shows the host and its slots; without a snapshot
// covering them, it refuses with ErrTruncated rather than print a fleet
// without the host.
func TestReplayOfATruncatedLog(t *testing.T) {
	ctx, js := newLog(t)
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{MaxMsgs: 4}); err != nil {
		t.Fatal(err)
	}
	app := &eventlog.Appender{JS: js, Source: "test"}
	fold := events.NewFleet()
	put := func(p events.Payload) {
		t.Helper()
		ev := app.New(time.Now(), p)
		seq, _, err := app.Append(ctx, ev, nil)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = seq
		fold.Apply(ev)
	}
	queued := func(id int64) events.Payload {
		return &events.JobQueued{JobRef: events.JobRef{JobID: id, Labels: []string{"self-hosted", "linux"}}}
	}
	put(&events.HostOnline{Host: "mac-1", Boot: "b", PhysicalCap: 2, CurveKey: "X",
		Pools: map[string]events.PoolSlots{"macos": {Labels: []string{"self-hosted", "macos"}, Slots: 2}}})
	put(queued(1))
	snap, err := events.MarshalSnapshot(fold)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketSnapshots, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "dispatcher", snap); err != nil {
		t.Fatal(err)
	}
	for id := int64(2); id <= 5; id++ {
		put(queued(id))
	}

	r, err := cli.Replay(ctx, js, 0, time.Time{}, nil)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if r.Status.AsOfSeq != 6 || len(r.Status.Hosts) != 1 || r.Status.Hosts[0].Name != "mac-1" || r.Status.Jobs != fold.Status().Jobs {
		t.Errorf("status %+v: want mac-1 and the 5 jobs as of seq 6", r.Status)
	}
	if n := r.Note(); !strings.Contains(n, "dispatcher's snapshot at seq 2") || !strings.Contains(n, "before seq 3 have expired") {
		t.Errorf("note %q: want it to say the replay starts from the dispatcher's snapshot", n)
	}

	if err := kv.Delete(ctx, "dispatcher"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Replay(ctx, js, 0, time.Time{}, nil); !errors.Is(err, eventlog.ErrTruncated) ||
		!strings.Contains(err.Error(), "dispatcher: none saved") {
		t.Errorf("replay without a covering snapshot: %v, want ErrTruncated naming the missing snapshot", err)
	}
}
