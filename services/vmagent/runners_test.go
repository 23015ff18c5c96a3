package vmagent_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/services/vmagent/runnerlog"
)

// refusedRunner is an exec create step whose "runner" (started in the
// background, its output on BERTH_RUNNER_LOG as the contract says) prints
// what actions/runner prints when GitHub refuses its version, and exits
// without taking a job.
const refusedRunner = `
( echo "√ Connected to GitHub"
  echo ""
  echo "Current runner version: '2.310.0'"
  echo "2026-10-01 09:00:00Z: Listening for Jobs"
  echo "An error occured: Runner version v2.310.0 is deprecated and cannot receive messages."
  echo "Runner listener exit with terminated error, stop the service, no retry needed."
  echo "Exiting runner..." ) >"$BERTH_RUNNER_LOG" 2>&1 &
`

// A host whose shaped pool boots an image with a runner GitHub no longer
// accepts: the agent, through the exec backend, reports the version the
// image started and GitHub's refusal of it, naming the image and GitHub's
// words, each once; the attempt is not failed by the agent (its slot is
// the dispatcher's to release, charged to the image).
func TestTheAgentReportsTheRunnerVersionAndGitHubsRefusal(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "create.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+refusedRunner), 0o755); err != nil {
		t.Fatal(err)
	}
	b := exec.New([]string{script}, []string{"true"}, nil)
	h := newHarnessOn(t, b, func(o *vmagent.Options) {
		o.CreateTimeout, o.StopTimeout, o.RunnerPoll = 5*time.Second, 5*time.Second, 20*time.Millisecond
		o.Pools = map[string]events.PoolSlots{
			"linux":     {Labels: []string{"self-hosted", "linux"}, Slots: 2},
			"linux-old": {Labels: []string{"berth-image-ubuntu-old", "self-hosted", "linux"}, Slots: 2, Shape: &events.Shape{Image: "ubuntu-old"}},
		}
	})

	h.placeIn(t, "linux-old", "berth-70-1", 70, []byte("jit"))
	h.wait(t, "berth-70-1", events.TypeAttemptRunnerStarted)
	version := h.wait(t, "berth-70-1", events.TypeAttemptRunnerVersion).Data.(*events.AttemptRunnerVersion)
	refused := h.wait(t, "berth-70-1", events.TypeAttemptRunnerRefused).Data.(*events.AttemptRunnerRefused)

	if version.Image != "ubuntu-old" || version.Version != "2.310.0" {
		t.Errorf("version fact %+v; want image ubuntu-old, version 2.310.0", version)
	}
	if refused.Image != "ubuntu-old" || refused.Version != "2.310.0" ||
		refused.Message != "An error occured: Runner version v2.310.0 is deprecated and cannot receive messages." {
		t.Errorf("refused fact %+v; want image ubuntu-old, version 2.310.0 and GitHub's words", refused)
	}
	// The agent does not fail the attempt: it reports, the dispatcher
	// charges the image.
	if f := h.attemptFacts("berth-70-1", events.TypeAttemptFailed); len(f) != 0 {
		t.Errorf("the agent failed the attempt: %v", f)
	}
}

// Given the outputs an agent read, RunnerReports reports each attempt's
// version and GitHub's refusal once: not what the fold already holds, not
// what is in flight, not for a runner that took a job or another host's.
func TestRunnerReportsEachFactOnce(t *testing.T) {
	f := events.NewFleet()
	pools := map[string]events.PoolSlots{"linux": {Labels: []string{"linux"}, Slots: 4}}
	started := func(id, host string, bound int64) *events.Attempt {
		a := &events.Attempt{ID: id, Pool: "linux", Host: host, Reserved: true, Placed: true, RunnerStarted: true, BoundJobID: bound}
		f.Attempts[id] = a
		return a
	}
	started("berth-1-1", "host-a", 0)
	started("berth-2-1", "host-a", 0).RunnerVersion = "2.310.0" // reported already
	started("berth-3-1", "host-a", 0)                           // its refusal is in flight
	started("berth-4-1", "host-a", 33)                          // took a job
	started("berth-5-1", "host-b", 0)                           // another host's
	refused := runnerlog.Status{Version: "2.310.0", Refused: true, Message: "Runner version v2.310.0 is deprecated and cannot receive messages."}
	seen := map[string]runnerlog.Status{"berth-1-1": {Version: "2.337.0"}, "berth-2-1": refused, "berth-3-1": refused,
		"berth-4-1": refused, "berth-5-1": refused}
	inFlight := func(id string) bool { return id == "berth-3-1/runner_refused" }

	got := vmagent.RunnerReports(f, "host-a", pools, seen, inFlight)
	var ids []string
	for _, p := range got {
		ids = append(ids, p.EventID())
	}
	want := []string{"berth-1-1/runner_version", "berth-2-1/runner_refused", "berth-3-1/runner_version"}
	if !slices.Equal(ids, want) {
		t.Errorf("reports %v; want %v", ids, want)
	}
	if r := got[1].(events.AttemptRunnerRefused); r.Image != "default/linux" || r.Version != "2.310.0" {
		t.Errorf("refusal %+v; want image default/linux (the pool declares none), version 2.310.0", r)
	}
}
