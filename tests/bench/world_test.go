package bench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/berth-ci/berth/tests/ghsim"
)

// Given a world process's control API (served here, in the test's
// process), when the bench enqueues a job, reads the world's state and
// closes its simulator, then the job is the simulator's, the state
// reports a heap, the simulator is gone from the job list, and closing
// the world's stdin ends it without an error.
func TestTheWorldIsDrivenThroughItsControlAPI(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	fixtures, err := FixturesDir(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, _ := json.Marshal(WorldConfig{NATSURL: "nats://127.0.0.1:1", DispatcherAddr: "127.0.0.1:1", Secret: "s",
		Fleet: FleetOptions{Hosts: 1, LinuxSlots: 1, Fixtures: fixtures}, LogLevel: 12})
	stdinR, stdinW := io.Pipe()
	outR, outW := io.Pipe()
	ended := make(chan error, 1)
	go func() { ended <- ServeWorld(ctx, string(cfg), stdinR, outW) }()

	var addrs worldAddrs
	if err := json.NewDecoder(outR).Decode(&addrs); err != nil {
		t.Fatalf("the world's first line: %v", err)
	}
	go io.Copy(io.Discard, outR)
	w := &world{control: addrs.Control, http: &http.Client{Timeout: 10 * time.Second}}

	var id int64
	if err := w.call(ctx, http.MethodPost, "/enqueue", ghsim.JobSpec{Labels: LinuxLabels}, &id); err != nil || id == 0 {
		t.Fatalf("enqueue: id %d, %v; want a job id", id, err)
	}
	var jobs worldJobs
	if err := w.call(ctx, http.MethodGet, "/jobs", nil, &jobs); err != nil || len(jobs.Jobs) != 1 || jobs.Jobs[0].ID != id {
		t.Fatalf("jobs: %+v, %v; want job %d alone", jobs.Jobs, err, id)
	}
	st, err := w.state(ctx, true)
	if err != nil || st.Heap == 0 || st.Goroutines == 0 || st.CPU <= 0 {
		t.Fatalf("state: %+v, %v; want a heap, goroutines and CPU time", st, err)
	}
	if err := w.call(ctx, http.MethodPost, "/close-sim", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.call(ctx, http.MethodGet, "/jobs", nil, &jobs); err != nil || len(jobs.Jobs) != 0 {
		t.Fatalf("jobs after the simulator closed: %+v, %v; want none", jobs.Jobs, err)
	}
	if err := w.call(ctx, http.MethodPost, "/nothing-here", nil, nil); err == nil {
		t.Fatal("an unknown control path answered OK")
	}

	stdinW.Close()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the world ended with %v, want nil once its stdin closed", err)
		}
	case <-ctx.Done():
		t.Fatal("the world did not end within 30 s of its stdin closing")
	}
}
