package page

import (
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
)

// View is everything one rendering of the page shows: the status
// projection `berth status --json` prints (events.Fleet.Status, with the
// heartbeats), the jobs the fold still holds, and the pictures. It holds
// no JIT config, no webhook payload and no secret: only the fields named
// here reach a template.
type View struct {
	Now    time.Time
	Status events.Status
	// Waiting are the jobs that wait for a runner, longest first;
	// Recent the others, newest first, at most RecentJobs.
	Waiting, Recent []JobRow
	Charts          []PoolChart
	// Stream is the stream's drift from this dispatcher's config (empty:
	// as configured), StreamOK whether the service's health says ok.
	Stream   []string
	StreamOK bool
}

// RecentJobs caps the recent jobs listed: the page stays small however
// many jobs the fold's retention holds.
const RecentJobs = 40

// JobRow is one job as the page lists it.
type JobRow struct {
	ID         int64
	Repo, Name string
	Labels     []string
	Pool       string
	Status     string // waiting, queued, in_progress, completed, unschedulable
	Conclusion string
	Runner     string
	QueuedAt   time.Time
	// Queue is how long it waited for a runner: queued → a runner took it,
	// or queued → now while it waits. Zero when the queue time is unknown.
	Queue    time.Duration
	Attempts int
	Reason   string // why it is unschedulable
}

// PoolChart is one pool's pictures: its queue time distribution, and its
// held slots and demand over the last hour.
type PoolChart struct {
	Pool      string
	Capacity  int
	QueueHist []Bucket
	Samples   []Sample
}

// Bucket counts the jobs whose queue time is below Below (the last
// bucket: any longer).
type Bucket struct {
	Label string
	Below time.Duration
	Jobs  int
}

// queueEdges are the queue time histogram's upper bounds.
var queueEdges = []struct {
	label string
	below time.Duration
}{
	{"<1s", time.Second}, {"<5s", 5 * time.Second}, {"<30s", 30 * time.Second}, {"<1m", time.Minute},
	{"<5m", 5 * time.Minute}, {"<15m", 15 * time.Minute}, {"<1h", time.Hour}, {"≥1h", 1<<63 - 1},
}

// build derives the view from the fold (on the dispatcher's loop, so it
// only copies what it keeps; View.order sorts afterwards) and the status
// made from it.
func build(f *events.Fleet, st events.Status, now time.Time) View {
	v := View{Now: now, Status: st}
	match := f.NewMatcher()
	attempts := map[int64]int{}
	pools := map[int64]string{}
	for _, a := range f.Attempts {
		if a.JobID != 0 {
			attempts[a.JobID]++
			pools[a.JobID] = a.Pool
		}
	}
	hist := map[string][]Bucket{}
	for _, j := range f.Jobs {
		r := jobRow(j, now, attempts[j.ID])
		if r.Pool = pools[j.ID]; r.Pool == "" {
			r.Pool = match.MatchJob(j)
		}
		if j.Demand() || j.Status == events.StatusWaiting {
			v.Waiting = append(v.Waiting, r)
		} else {
			v.Recent = append(v.Recent, r)
		}
		if !j.StartedAt.IsZero() && !j.QueuedAt.IsZero() && r.Pool != "" {
			hist[r.Pool] = count(hist[r.Pool], r.Queue)
		}
	}
	for _, p := range st.Pools {
		h := hist[p.Name]
		if h == nil {
			h = count(nil, -1)
		}
		v.Charts = append(v.Charts, PoolChart{Pool: p.Name, Capacity: p.Capacity, QueueHist: h})
	}
	return v
}

// order sorts the job lists (waiting: longest first; recent: newest
// first, at most RecentJobs): done off the dispatcher's loop, after build.
func (v *View) order() {
	sort.Slice(v.Waiting, func(i, k int) bool { return olderFirst(v.Waiting[i], v.Waiting[k]) })
	sort.Slice(v.Recent, func(i, k int) bool { return olderFirst(v.Recent[k], v.Recent[i]) })
	if len(v.Recent) > RecentJobs {
		v.Recent = v.Recent[:RecentJobs]
	}
}

func olderFirst(a, b JobRow) bool {
	if !a.QueuedAt.Equal(b.QueuedAt) {
		return a.QueuedAt.Before(b.QueuedAt)
	}
	return a.ID < b.ID
}

// count adds one queue time to the histogram (d < 0: none, only the
// buckets).
func count(h []Bucket, d time.Duration) []Bucket {
	if h == nil {
		h = make([]Bucket, len(queueEdges))
		for i, e := range queueEdges {
			h[i] = Bucket{Label: e.label, Below: e.below}
		}
	}
	if d < 0 {
		return h
	}
	for i := range h {
		if d < h[i].Below || i == len(h)-1 {
			h[i].Jobs++
			break
		}
	}
	return h
}

func jobRow(j *events.Job, now time.Time, attempts int) JobRow {
	r := JobRow{ID: j.ID, Repo: j.Repo, Name: j.Name, Labels: append([]string(nil), j.Labels...), Status: j.Status.String(),
		Conclusion: j.Conclusion, Runner: j.Runner, QueuedAt: j.QueuedAt, Attempts: attempts}
	if j.Unschedulable && j.Status < events.StatusInProgress {
		r.Status, r.Reason = "unschedulable", j.UnschedulableReason
	}
	switch {
	case j.QueuedAt.IsZero():
	case !j.StartedAt.IsZero():
		r.Queue = j.StartedAt.Sub(j.QueuedAt)
	case j.Status < events.StatusInProgress:
		r.Queue = now.Sub(j.QueuedAt)
	}
	if r.Queue < 0 {
		r.Queue = 0
	}
	return r
}
