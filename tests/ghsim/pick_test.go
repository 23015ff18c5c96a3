package ghsim

import (
	"math/rand/v2"
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

// Given jobs of label sets that differ only in case, order and repeats,
// some taken, some held by a scale set, and more enqueued between picks,
// when runners of random labels pick and take in turn, then every pick is
// the job a walk over every job from the oldest would give: the oldest
// open job no set holds whose labels the runner's cover.
func TestAPickByLabelSetIsTheWalksPick(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 19))
	variants := [][]string{
		{"self-hosted", "linux"}, {"Linux", "SELF-HOSTED"}, {"linux", "self-hosted", "linux"},
		{"self-hosted", "macOS", "arm64"}, {"ARM64", "macos", "self-hosted"}, {"self-hosted"}, {"gpu", "linux"},
	}
	runners := [][]string{{"self-hosted", "linux"}, {"self-hosted", "macos", "ARM64"}, {"self-hosted", "linux", "gpu"}, {"windows"}}
	walk := func(s *Sim, r *runner) *job {
		for _, j := range s.jobs {
			if j.open() && mayTake(r, j) {
				return j
			}
		}
		return nil
	}
	s := &Sim{}
	enqueue := func(n int) {
		for range n {
			j := &job{id: int64(len(s.jobs) + 1), status: StatusQueued, labels: variants[rng.IntN(len(variants))]}
			switch rng.IntN(8) {
			case 0:
				j.status = StatusCompleted
			case 1:
				j.set = 1 // held by a scale set: no other runner may take it
			}
			s.jobs = append(s.jobs, j)
		}
	}
	enqueue(50)
	picked := 0
	for i := range 400 {
		if i%10 == 0 {
			enqueue(rng.IntN(8))
		}
		r := &runner{id: int64(i + 1), labels: runners[rng.IntN(len(runners))]}
		want, got := walk(s, r), s.pickJobLocked(r)
		if got != want {
			t.Fatalf("pick %d (%v): job %v, want %v", i+1, r.labels, idOf(got), idOf(want))
		}
		if got != nil {
			got.status, got.runnerID = StatusInProgress, r.id
			picked++
		}
	}
	if picked < 50 {
		t.Fatalf("only %d picks took a job: the draw does not exercise the index", picked)
	}
}

func idOf(j *job) int64 {
	if j == nil {
		return 0
	}
	return j.id
}

// BenchmarkPickBehindABacklogOfOtherLabels is a runner's pick with 10,000
// open jobs of other labels queued before the one it can take: the walk
// passed every one of them on every wake.
func BenchmarkPickBehindABacklogOfOtherLabels(b *testing.B) {
	const n = 10_000
	statuses, labels := make([]string, n+1), make([][]string, n+1)
	for i := range n {
		statuses[i], labels[i] = StatusQueued, []string{"self-hosted", "macos"}
	}
	statuses[n], labels[n] = StatusQueued, []string{"self-hosted", "linux"}
	s := jobsOf(statuses, labels)
	r := &runner{labels: []string{"self-hosted", "linux"}}
	b.ReportAllocs()
	for b.Loop() {
		if j := s.pickJobLocked(r); j == nil || j.id != n+1 {
			b.Fatal("the open job was not found")
		}
	}
}
