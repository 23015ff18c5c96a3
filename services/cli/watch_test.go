package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Given `berth status --watch --json`, when facts arrive while it watches,
// then a later print shows them (folded from where the last print was, not
// by a fresh replay), and the watch ends cleanly when its context ends.
func TestWatchStatusShowsNewFactsAsTheyCome(t *testing.T) {
	ctx, js := newLog(t)
	app := &eventlog.Appender{JS: js, Source: "test"}
	add := func(p events.Payload) {
		t.Helper()
		if _, _, err := app.Append(ctx, app.New(time.Now(), p), nil); err != nil {
			t.Fatal(err)
		}
	}
	add(events.HostOnline{Host: "mac-1", Boot: "b", PhysicalCap: 2,
		Pools: map[string]events.PoolSlots{"macos": {Labels: []string{"macos"}, Slots: 2}}})
	out := &syncBuffer{}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cli.WatchStatus(wctx, js, out, 20*time.Millisecond, true, false) }()
	prints := func() []events.Status {
		var all []events.Status
		dec := json.NewDecoder(strings.NewReader(out.String()))
		for {
			var st events.Status
			if dec.Decode(&st) != nil {
				return all
			}
			all = append(all, st)
		}
	}
	waitFor := func(what string, ok func([]events.Status) bool) {
		t.Helper()
		testkit.EventuallyErr(t, 10*time.Second, "a print shows "+what, func() error {
			if ok(prints()) {
				return nil
			}
			return fmt.Errorf("printed:\n%s", out.String())
		})
	}
	waitFor("the host", func(ps []events.Status) bool { return len(ps) > 0 && len(ps[0].Hosts) == 1 })
	add(events.JobQueued{JobRef: events.JobRef{Delivery: "d-1", JobID: 7, Labels: []string{"macos"}}})
	add(events.HostCordoned{HostChange: events.HostChange{Host: "mac-1", Reason: "disk", By: "operator"}})
	waitFor("the queued job and the cordon", func(ps []events.Status) bool {
		last := ps[len(ps)-1]
		return last.Jobs.Queued == 1 && len(last.Hosts) == 1 && last.Hosts[0].Cordoned
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after its context")
	}
}
