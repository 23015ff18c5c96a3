package eventlog_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

// foldReactor is a Snapshotter over the real fleet fold.
type foldReactor struct {
	mu       sync.Mutex
	fleet    *events.Fleet
	applied  int // facts applied by this run (not counting the snapshot)
	restored uint64
}

func (r *foldReactor) Apply(d eventlog.Delivered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Err == nil {
		r.fleet.Apply(d.Event)
		r.applied++
	}
}
func (r *foldReactor) Decide(context.Context) {}
func (r *foldReactor) SaveFold() (func(io.Writer) error, uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	z, err := events.FreezeSnapshot(r.fleet)
	if err != nil {
		return nil, 0, err
	}
	return z.Encode, r.fleet.LastSeq, err
}
func (r *foldReactor) RestoreFold(b []byte) (uint64, error) {
	f, err := events.UnmarshalSnapshot(b)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fleet, r.restored = f, f.LastSeq
	return f.LastSeq, nil
}

func (r *foldReactor) state() (applied int, restored, last uint64, status events.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied, r.restored, r.fleet.LastSeq, r.fleet.Status()
}

// Given a service that saved a snapshot of its fold, when it restarts after
// more facts were appended, then it restores the snapshot, folds only the
// tail, and ends with the projection a full replay gives (law 9).
func TestRestartFromSnapshotFoldsOnlyTheTail(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)
	appendJobs := func(from, to int64) { appendJobRange(t, ctx, app, from, to) }
	appendJobs(1, 50)
	first := &foldReactor{fleet: events.NewFleet()}
	l1 := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 20 * time.Millisecond,
		SnapshotKey: "test", SnapshotEvery: 20 * time.Millisecond}
	run1, stop1 := context.WithCancel(ctx)
	done1 := make(chan error, 1)
	go func() { done1 <- l1.Run(run1, first) }()
	testkit.EventuallyErr(t, waitLimit, "a snapshot covering seq 50 saved", func() error {
		kv, err := js.KeyValue(ctx, events.BucketSnapshots)
		if err != nil {
			return err // the loop has not made the bucket yet
		}
		b, err := eventlog.GetSnapshot(ctx, kv, "test")
		if err != nil {
			return err
		}
		f, err := events.UnmarshalSnapshot(b)
		if err == nil && f.LastSeq != 50 {
			err = fmt.Errorf("snapshot at seq %d", f.LastSeq)
		}
		return err
	})
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}

	appendJobs(51, 60)
	second := &foldReactor{fleet: events.NewFleet()}
	l2 := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 20 * time.Millisecond, SnapshotKey: "test"}
	run2, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- l2.Run(run2, second) }()
	defer func() { stop2(); <-done2 }()
	testkit.Eventually(t, waitLimit, "the restarted loop reaches seq 60", func() bool { _, _, last, _ := second.state(); return last == 60 })
	applied, restored, _, got := second.state()
	if restored != 50 || applied != 10 {
		t.Errorf("restored from seq %d and applied %d facts; want 50 and the 10-fact tail", restored, applied)
	}
	full, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := full.Status(); want.Jobs != got.Jobs || want.AsOfSeq != got.AsOfSeq {
		t.Errorf("snapshot + tail %+v, full replay %+v", got.Jobs, want.Jobs)
	}
}

// blockedEncoder is a foldReactor whose snapshot encoding waits to be let
// go, as a large fold's takes long.
type blockedEncoder struct {
	*foldReactor
	encoding chan uint64 // the sequence of the copy being encoded
	release  chan struct{}
}

func (r *blockedEncoder) SaveFold() (func(io.Writer) error, uint64, error) {
	encode, seq, err := r.foldReactor.SaveFold()
	return func(w io.Writer) error {
		select {
		case r.encoding <- seq:
		default: // a later snapshot: not this test's
		}
		<-r.release
		return encode(w)
	}, seq, err
}

// Given a service whose fold takes long to encode, when a snapshot is being
// encoded, then the loop goes on folding new facts meanwhile (a dispatcher
// whose loop encoded 10,000 running jobs held every placement for seconds),
// and the snapshot stored is the fold as it was copied.
func TestALoopFoldsOnWhileItsSnapshotIsEncoded(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)
	appendJobs := func(from, to int64) { appendJobRange(t, ctx, app, from, to) }
	appendJobs(1, 5)
	r := &blockedEncoder{foldReactor: &foldReactor{fleet: events.NewFleet()}, encoding: make(chan uint64, 1), release: make(chan struct{})}
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 20 * time.Millisecond,
		SnapshotKey: "test", SnapshotEvery: 20 * time.Millisecond}
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(run, r) }()
	var let sync.Once
	letGo := func() { let.Do(func() { close(r.release) }) }
	defer func() { letGo(); stop(); <-done }() // a failure must not leave the encoder waiting
	var frozenAt uint64
	select {
	case frozenAt = <-r.encoding:
	case <-time.After(waitLimit):
		t.Fatal("no snapshot was started")
	}
	appendJobs(6, 10)
	testkit.Eventually(t, waitLimit, "the loop folds seq 10 while the snapshot is encoded", func() bool { _, _, last, _ := r.state(); return last == 10 })
	letGo()
	testkit.EventuallyErr(t, waitLimit, "the snapshot stored", func() error {
		kv, err := js.KeyValue(ctx, events.BucketSnapshots)
		if err != nil {
			return err
		}
		b, err := eventlog.GetSnapshot(ctx, kv, "test")
		if err != nil {
			return err
		}
		f, err := events.UnmarshalSnapshot(b)
		if err == nil && f.LastSeq < frozenAt {
			err = fmt.Errorf("snapshot at seq %d, the copy was at %d", f.LastSeq, frozenAt)
		}
		return err
	})
}

// appendJobRange appends job.queued facts for jobs from to to.
func appendJobRange(t *testing.T, ctx context.Context, app *eventlog.Appender, from, to int64) {
	t.Helper()
	for id := from; id <= to; id++ {
		ev := app.New(time.Now(), events.JobQueued{JobRef: events.JobRef{JobID: id, Labels: []string{"self-hosted"}}})
		if _, _, err := app.Append(ctx, ev, nil); err != nil {
			t.Fatal(err)
		}
	}
}
