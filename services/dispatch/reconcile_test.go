package dispatch_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

var recon = dispatch.Reconcile{After: 5 * time.Minute, Every: time.Minute, Limit: 2}

// Given jobs whose webhooks stopped coming (GitHub does not retry a failed
// delivery), the reconcile poll asks about the oldest quiet ones that hold
// something of ours, at most Limit a round, and never about fresh ones or
// jobs run by runners that are not ours.
func TestReconcileAsksAboutQuietJobsOldestFirst(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(2), queued(3))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: attempt(1, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1}, inProgress(1, r.Attempt), inProgress(3, "someone-elses-runner"))
	for _, j := range l.f.Jobs {
		j.Org, j.Repo = "example-org", "example-repo"
	}
	now := t0.Add(10 * time.Minute) // every fact above is stamped t0
	got := dispatch.ReconcileCandidates(l.f, now, recon)
	if len(got) != 2 {
		t.Fatalf("%d candidates, want 2 (jobs 1 and 2; job 3 is not ours)", len(got))
	}
	for _, j := range got {
		if j.ID == 3 {
			t.Fatal("asked about a job a runner of someone else runs")
		}
	}
	if fresh := dispatch.ReconcileCandidates(l.f, t0.Add(time.Minute), recon); len(fresh) != 0 {
		t.Fatalf("asked about jobs with a fact a minute old: %d", len(fresh))
	}
}

// Given a backlog of quiet queued jobs older than a job in progress on a
// runner of ours (its completion lost), when a round may ask about fewer
// jobs than the backlog holds, then the job in progress is asked about
// first: its runner holds a slot, and the queued jobs stay candidates
// round after round while GitHub says they wait.
func TestReconcileAsksAboutJobsOnOurRunnersBeforeTheBacklog(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(2), queued(3), queued(4))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: attempt(4, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 4}, inProgress(4, r.Attempt))
	for _, j := range l.f.Jobs {
		j.Org, j.Repo = "example-org", "example-repo"
	}
	l.f.Jobs[4].StartedAt = t0.Add(time.Minute) // the newest fact of all
	got := dispatch.ReconcileCandidates(l.f, t0.Add(10*time.Minute), recon)
	if len(got) != 2 || got[0].ID != 4 {
		t.Fatalf("candidates %v, want job 4 (in progress on our runner) first of 2", ids(got))
	}
}

func ids(js []*events.Job) []int64 {
	var out []int64
	for _, j := range js {
		out = append(out, j.ID)
	}
	return out
}

// GitHub's answer becomes the fact the lost webhook would have carried; an
// answer that adds nothing (still queued) becomes nothing.
func TestReconcileFactFromTheAPIsAnswer(t *testing.T) {
	l := given(t).add(queued(1))
	j := l.f.Jobs[1]
	if p, ok := dispatch.ReconcileFact(j, dispatch.JobState{Status: "completed", Conclusion: "success", RunnerName: "berth-1-1"}).(events.JobCompleted); !ok || p.RunnerName != "berth-1-1" || p.JobID != 1 {
		t.Fatalf("completed: %#v", p)
	}
	if p, ok := dispatch.ReconcileFact(j, dispatch.JobState{Status: "in_progress", RunnerName: "berth-1-1"}).(events.JobInProgress); !ok || p.RunnerName != "berth-1-1" {
		t.Fatalf("in progress: %#v", p)
	}
	if p := dispatch.ReconcileFact(j, dispatch.JobState{Status: "queued"}); p != nil {
		t.Fatalf("still queued: %#v", p)
	}
}

// The read goes to GET /repos/{o}/{r}/actions/jobs/{id} and decodes
// GitHub's job shape (the shared fixture of that endpoint).
func TestJobStateReadsTheJobEndpoint(t *testing.T) {
	body, err := os.ReadFile(filepath.Join(repoRoot(t), "..", "shared", "fixtures", "github", "api", "actions.jobs.get.200.json"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/repos/octo-org/octo-repo/actions/jobs/399444496" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	defer srv.Close()
	gh, _ := dispatch.NewGitHubClient(srv.URL, "t", nil)
	m := &dispatch.GitHubMinter{Client: gh}
	s, err := m.JobState(t.Context(), "octo-org", "octo-repo", 399444496)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != "completed" || s.Conclusion != "success" {
		t.Errorf("decoded %+v", s)
	}
}
