package dispatch_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Given a surplus runner that was already placed (its registration exists
// and it may have taken a job whose in_progress has not arrived), when a
// job is cancelled before any runner took it, then the dispatcher does not
// release the slot on that lagging read: it plans to deregister the runner
// through the API first (law 7). An unplaced booking is released at once.
func TestAPlacedSurplusRunnerIsDeregisteredBeforeItsSlotIsReleased(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(2))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: attempt(1, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1, RunnerID: 77})
	l.add(completed(1, "", "cancelled"), completed(2, "", "cancelled"))
	plan := l.decide()
	if len(plan.Deregister) != 1 || plan.Deregister[0].ID != r.Attempt {
		t.Fatalf("deregister %v, want the placed attempt %s", plan.Deregister, r.Attempt)
	}
	got := attempts(plan.Release)
	if _, ok := got[r.Attempt]; ok {
		t.Fatalf("released the placed runner's slot before GitHub confirmed: %v", got)
	}
	if got[attempt(2, 1)] != events.ReleaseSurplus {
		t.Fatalf("unplaced surplus booking not released: %v", got)
	}
}

// Deregister maps GitHub's answers: 204 and a confirmed 404 mean gone; 422
// ("still running a job") is ErrRunnerBusy; anything else is an error to
// retry.
func TestDeregisterMapsGitHubsAnswers(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   error
		isErr  bool
	}{
		{http.StatusNoContent, nil, false},
		{http.StatusNotFound, nil, false},
		{http.StatusUnprocessableEntity, dispatch.ErrRunnerBusy, true},
		{http.StatusInternalServerError, nil, true},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodDelete || r.URL.Path != "/orgs/example-org/actions/runners/77" {
				t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			if tc.status != http.StatusNoContent {
				w.Write([]byte(`{"message":"Bad request - Runner \"berth-1-1\" is still running a job"}`))
			}
		}))
		gh, err := dispatch.NewGitHubClient(srv.URL, "t", nil)
		if err != nil {
			t.Fatal(err)
		}
		m := &dispatch.GitHubMinter{Client: gh, Scope: "org", Org: "example-org"}
		err = m.Deregister(t.Context(), 77, "example-org", "example-repo")
		srv.Close()
		switch {
		case !tc.isErr && err != nil:
			t.Errorf("%d: %v, want gone", tc.status, err)
		case tc.isErr && err == nil:
			t.Errorf("%d: nil, want an error", tc.status)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%d: %v, want %v", tc.status, err, tc.want)
		}
	}
}

// Given released attempts, the dispatcher deletes the registration of a
// runner that never ran a job (it would linger offline for a day, or take a
// job its torn-down VM cannot run), once; a runner that ran its job is left
// to GitHub, which removes ephemeral runners itself (≤ 3 API calls a job).
func TestReleasedRunnersThatNeverRanAJobAreDeregisteredOnce(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(2))
	l.apply(l.decide())
	never := events.AttemptRef{Attempt: attempt(1, 1), Pool: "linux", Host: "h-a"}
	ran := events.AttemptRef{Attempt: attempt(2, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: never, JobID: 1, RunnerID: 71}, &events.AttemptPlaced{AttemptRef: ran, JobID: 2, RunnerID: 72},
		released(1, 1, "h-a", events.ReleaseProvisionTimeout), inProgress(2, ran.Attempt), completed(2, ran.Attempt, "success"),
		released(2, 1, "h-a", events.ReleaseCompleted))
	plan := l.decide()
	if len(plan.Cleanup) != 1 || plan.Cleanup[0].ID != never.Attempt {
		t.Fatalf("cleanup %v, want only %s", plan.Cleanup, never.Attempt)
	}
	l.add(&events.AttemptDeregistered{AttemptRef: never, RunnerID: 71})
	if plan := l.decide(); len(plan.Cleanup) != 0 {
		t.Fatalf("deregistered twice: %v", plan.Cleanup)
	}
}

// Which mint failures keep the booking (try again) and which release it:
// only GitHub refusing (4xx other than 409 and rate limits) spends an
// attempt; a 409 means the runner already exists (another replica minted it).
func TestMintRetryableClassifiesGitHubAnswers(t *testing.T) {
	for status, want := range map[int]bool{409: true, 429: true, 500: true, 502: true, 422: false, 404: false, 401: false} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			w.Write([]byte(`{"message":"no"}`))
		}))
		gh, _ := dispatch.NewGitHubClient(srv.URL, "t", nil)
		m := &dispatch.GitHubMinter{Client: gh, Scope: "org", Org: "example-org"}
		_, _, err := m.Mint(t.Context(), dispatch.MintRequest{RunnerName: "berth-1-1", Labels: []string{"x"}})
		srv.Close()
		if got := dispatch.MintRetryable(err); got != want {
			t.Errorf("%d: retryable %v, want %v (%v)", status, got, want, err)
		}
	}
}

// Given a placed runner that started and has taken no job as far as the log
// knows, when its registration deadline passes, then the dispatcher does not
// release its slot on that absence (the in_progress webhook may be late):
// it plans to delete the registration, which GitHub refuses while the
// runner runs a job. Before the deadline it plans nothing for it.
func TestAnIdleRunnerPastItsRegistrationDeadlineIsDeregisteredNotReleased(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: attempt(1, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1, RunnerID: 77}, &events.AttemptRunnerStarted{AttemptRef: r})
	p := params
	p.RegistrationTimeout = 10 * time.Minute
	started := l.f.Attempts[r.Attempt].RunnerStartedAt

	p.Now = started.Add(9 * time.Minute)
	if plan := dispatch.Decide(l.f, p); len(plan.Deregister) != 0 || len(plan.Release) != 0 {
		t.Fatalf("before the deadline: deregister %v, release %v; want neither", plan.Deregister, plan.Release)
	}
	p.Now = started.Add(11 * time.Minute)
	plan := dispatch.Decide(l.f, p)
	if len(plan.Deregister) != 1 || plan.Deregister[0].ID != r.Attempt {
		t.Fatalf("past the deadline: deregister %v, want %s", plan.Deregister, r.Attempt)
	}
	if _, ok := attempts(plan.Release)[r.Attempt]; ok {
		t.Fatalf("released on the absence of an in_progress fact")
	}
	if got := p.Expired(l.f, l.f.Attempts[r.Attempt]); got != events.ReleaseRegistration {
		t.Fatalf("Expired = %q, want %q (the release reason once GitHub confirms)", got, events.ReleaseRegistration)
	}
}

// Given an idle runner placed on a host the watchdog then declared lost,
// when the dispatcher decides, then it deletes the runner's registration
// rather than releasing the slot on the host's silence (a NATS outage
// silences live hosts, law 7), and the release that follows GitHub's
// confirmation names the host's loss.
func TestAnIdleRunnerOnALostHostIsDeregisteredNotReleased(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: attempt(1, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1, RunnerID: 77})
	if plan := l.decide(); len(plan.Deregister) != 0 {
		t.Fatalf("host online: deregister %v, want none", plan.Deregister)
	}
	l.add(&events.HostLost{HostChange: events.HostChange{Host: "h-a", By: "watchdog"}})
	plan := l.decide()
	if len(plan.Deregister) != 1 || plan.Deregister[0].ID != r.Attempt {
		t.Fatalf("host lost: deregister %v, want %s", plan.Deregister, r.Attempt)
	}
	if _, ok := attempts(plan.Release)[r.Attempt]; ok {
		t.Fatalf("released on the host's silence alone")
	}
	if got := params.Expired(l.f, l.f.Attempts[r.Attempt]); got != events.ReleaseHostLost {
		t.Fatalf("Expired = %q, want %q", got, events.ReleaseHostLost)
	}
}
