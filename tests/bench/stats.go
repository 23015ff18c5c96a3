package bench

import (
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/tests/ghsim"
)

// Dist summarises durations.
type Dist struct {
	N             int
	P50, P99, Max time.Duration
}

// Summarize computes nearest-rank percentiles.
func Summarize(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p/100*float64(len(s)))) - 1
		return s[max(i, 0)]
	}
	return Dist{N: len(s), P50: rank(50), P99: rank(99), Max: s[len(s)-1]}
}

// JobTimes is one job's story as the log stored it.
type JobTimes struct {
	Queued    time.Time // JobQueued stored: the webhook was accepted
	Reserved  time.Time // first SlotReserved for the job stored
	Placed    time.Time // first AttemptPlaced booked for the job stored
	Completed time.Time // JobCompleted stored
	Released  time.Time // SlotReleased of the attempt that ran it stored
	Runner    string    // the attempt that ran it
}

// Timeline is every job's times, read from stored facts.
type Timeline struct {
	Jobs        map[int64]*JobTimes
	Types       map[string]int
	Bytes       int
	First, Last time.Time // store times of the first and last fact
	LastRelease time.Time
	// HostOf maps each placed attempt to its host.
	HostOf map[string]string
}

// BuildTimeline folds stored facts into per-job times.
func BuildTimeline(log []Stored) Timeline {
	tl := Timeline{Jobs: map[int64]*JobTimes{}, Types: map[string]int{}, HostOf: map[string]string{}}
	job := func(id int64) *JobTimes {
		j := tl.Jobs[id]
		if j == nil {
			j = &JobTimes{}
			tl.Jobs[id] = j
		}
		return j
	}
	first := func(t *time.Time, at time.Time) {
		if t.IsZero() || at.Before(*t) {
			*t = at
		}
	}
	released := map[string]time.Time{}
	for i, s := range log {
		if i == 0 || s.At.Before(tl.First) {
			tl.First = s.At
		}
		if s.At.After(tl.Last) {
			tl.Last = s.At
		}
		tl.Types[s.Ev.Type()]++
		tl.Bytes += s.Size
		switch d := s.Ev.Data.(type) {
		case *events.JobQueued:
			first(&job(d.JobID).Queued, s.At)
		case *events.SlotReserved:
			if d.JobID != 0 { // a warm VM is booked for no job
				first(&job(d.JobID).Reserved, s.At)
			}
		case *events.AttemptPlaced:
			first(&job(d.JobID).Placed, s.At)
			tl.HostOf[d.Attempt] = d.Host
		case *events.JobCompleted:
			j := job(d.JobID)
			first(&j.Completed, s.At)
			if d.RunnerName != "" {
				j.Runner = d.RunnerName
			}
		case *events.SlotReleased:
			first2 := released[d.Attempt]
			first(&first2, s.At)
			released[d.Attempt] = first2
			if s.At.After(tl.LastRelease) {
				tl.LastRelease = s.At
			}
		}
	}
	for _, j := range tl.Jobs {
		if j.Runner != "" {
			j.Released = released[j.Runner]
		}
	}
	return tl
}

// PlaceLatency is webhook accepted → placement stored, per job.
func (tl Timeline) PlaceLatency() []time.Duration {
	var out []time.Duration
	for _, j := range tl.Jobs {
		if !j.Queued.IsZero() && !j.Placed.IsZero() {
			out = append(out, j.Placed.Sub(j.Queued))
		}
	}
	return out
}

// PlaceParts splits PlaceLatency at the booking: webhook accepted → slot
// reserved (a consumer delivery and a round of Decide), and slot reserved →
// placement stored (the JIT-config call, sealing, a loop turn, an append).
func (tl Timeline) PlaceParts() (toReserve, toPlace []time.Duration) {
	for _, j := range tl.Jobs {
		if !j.Queued.IsZero() && !j.Reserved.IsZero() && !j.Placed.IsZero() && !j.Placed.Before(j.Reserved) {
			toReserve = append(toReserve, j.Reserved.Sub(j.Queued))
			toPlace = append(toPlace, j.Placed.Sub(j.Reserved))
		}
	}
	return toReserve, toPlace
}

// ReleaseLatency is job completed → slot released (of the attempt that ran
// the job), per job.
func (tl Timeline) ReleaseLatency() []time.Duration {
	var out []time.Duration
	for _, j := range tl.Jobs {
		if !j.Completed.IsZero() && !j.Released.IsZero() {
			out = append(out, j.Released.Sub(j.Completed))
		}
	}
	return out
}

// Workload makes n job specs from seed: runs-on sets over both pools in
// mixed case, names of varied length, 10% failures, durations uniform in
// [minD, maxD]. macShare is the fraction of macOS jobs. With bare, some
// linux jobs ask for just "self-hosted", which runners of either pool may
// take (law 8).
func Workload(n int, seed uint64, macShare float64, minD, maxD time.Duration, bare bool) []ghsim.JobSpec {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	linux := [][]string{{"self-hosted", "linux"}, {"self-hosted", "linux", "x64"}, {"self-hosted", "Linux", "X64"}}
	if bare {
		linux = append(linux, []string{"self-hosted"})
	}
	mac := [][]string{{"self-hosted", "macos"}, {"self-hosted", "macOS", "ARM64"}}
	words := []string{"build", "test", "lint", "integration", "release", "e2e", "docs", "matrix"}
	out := make([]ghsim.JobSpec, n)
	for i := range out {
		labels := linux[r.IntN(len(linux))]
		if r.Float64() < macShare {
			labels = mac[r.IntN(len(mac))]
		}
		var name strings.Builder
		for k := 0; k <= r.IntN(4); k++ {
			if k > 0 {
				name.WriteString(" / ")
			}
			name.WriteString(words[r.IntN(len(words))])
		}
		name.WriteString(" (" + strconv.Itoa(r.IntN(1000)) + ")")
		d := minD
		if maxD > minD {
			d += time.Duration(r.Int64N(int64(maxD - minD + 1)))
		}
		c := ghsim.ConclusionSuccess
		if r.Float64() < 0.1 {
			c = ghsim.ConclusionFailure
		}
		out[i] = ghsim.JobSpec{Labels: labels, Duration: d, Conclusion: c, Name: name.String()}
	}
	return out
}
