package ghsim

import (
	"strconv"
	"testing"
)

// jobsOf is a simulator holding jobs with these statuses and labels, in
// enqueue order (ids from 1).
func jobsOf(statuses []string, labels [][]string) *Sim {
	s := &Sim{}
	for i, st := range statuses {
		s.jobs = append(s.jobs, &job{id: int64(i + 1), status: st, labels: labels[i]})
	}
	return s
}

// Given jobs taken and open, interleaved, when runners of two label sets
// ask in turn, then each gets the oldest open job its labels match, and
// one job that a runner of the other labels skipped is still found after
// the jobs before it were taken (the walk starts at the oldest open job,
// never past one).
func TestARunnerGetsTheOldestOpenJobItsLabelsMatch(t *testing.T) {
	linux, mac := []string{"self-hosted", "linux"}, []string{"self-hosted", "macos"}
	s := jobsOf([]string{StatusCompleted, StatusQueued, StatusInProgress, StatusQueued, StatusQueued},
		[][]string{linux, mac, linux, linux, mac})
	pick := func(labels []string) int64 {
		r := &runner{id: 99, labels: labels}
		j := s.pickJobLocked(r)
		if j == nil {
			return 0
		}
		j.status, j.runnerID = StatusInProgress, r.id
		return j.id
	}
	for i, want := range []struct {
		labels []string
		job    int64
	}{{linux, 4}, {mac, 2}, {mac, 5}, {linux, 0}, {mac, 0}} {
		if got := pick(want.labels); got != want.job {
			t.Fatalf("pick %d (%v): job %d, want %d", i+1, want.labels, got, want.job)
		}
	}
}

// BenchmarkPickAfterManyJobs is one runner's pick with 100,000 jobs
// enqueued before it and all of them over: the simulator's cost per job
// must not grow with the jobs it keeps (the bench's flatness row).
func BenchmarkPickAfterManyJobs(b *testing.B) {
	const n = 100_000
	statuses, labels := make([]string, n+1), make([][]string, n+1)
	for i := range n {
		statuses[i], labels[i] = StatusCompleted, []string{"linux", "j" + strconv.Itoa(i)}
	}
	statuses[n], labels[n] = StatusQueued, []string{"linux"}
	s := jobsOf(statuses, labels)
	r := &runner{labels: []string{"linux"}}
	b.ReportAllocs()
	for b.Loop() {
		if s.pickJobLocked(r) == nil {
			b.Fatal("the open job was not found")
		}
	}
}
