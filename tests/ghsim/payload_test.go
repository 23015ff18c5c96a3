package ghsim

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/testkit"
)

// Given a simulator, when it builds each kind of workflow_job webhook
// (queued, in progress, completed with success and failure, cancelled
// before any runner took it) twice, then each body is byte for byte the
// one a fresh deep copy of the fixture with a fresh envelope gives (the
// way every body was built before the envelope was encoded once), and
// building one leaves the fixtures as they were.
func TestAWebhookBuiltOnTheEncodedEnvelopeIsTheDeepCopysBody(t *testing.T) {
	s, err := New(Config{Org: "example-org", Repo: "example-repo", FixturesDir: sharedFixtures(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before, _ := json.Marshal(s.fx.hookQueued)
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	jobs := []struct {
		action string
		j      job
	}{
		{"queued", job{id: 1, runID: 2, name: "build", labels: []string{"self-hosted", "linux"}, status: StatusQueued, queuedAt: now}},
		{"in_progress", job{id: 1, runID: 2, name: "build", labels: []string{"self-hosted"}, status: StatusInProgress, queuedAt: now, startedAt: now,
			runnerID: 7, runnerName: "berth-1-1", runnerGroupID: 1, runnerGroupName: "Default"}},
		{"completed", job{id: 1, runID: 2, status: StatusCompleted, conclusion: ConclusionSuccess, queuedAt: now, startedAt: now, completedAt: now, runnerID: 7, runnerName: "r"}},
		{"completed", job{id: 3, runID: 4, status: StatusCompleted, conclusion: ConclusionFailure, queuedAt: now, startedAt: now, completedAt: now, runnerID: 8, runnerName: "r"}},
		{"completed", job{id: 5, runID: 6, status: StatusCompleted, conclusion: ConclusionCancelled, queuedAt: now, completedAt: now}},
	}
	for round := range 2 {
		for _, c := range jobs {
			got := s.jobHookBodyLocked(c.action, &c.j)
			want, err := json.Marshal(s.deepCopiedPayload(c.action, &c.j))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("round %d, %s (%s): the body differs from the deep copy's:\n got %s\nwant %s", round, c.action, c.j.conclusion, got, want)
			}
		}
	}
	if after, _ := json.Marshal(s.fx.hookQueued); !bytes.Equal(before, after) {
		t.Fatal("building webhooks changed the queued fixture")
	}
}

// deepCopiedPayload is the body as it was first built: a deep copy of the
// whole template and a fresh envelope for each, encoded as a map.
func (s *Sim) deepCopiedPayload(action string, j *job) map[string]any {
	_, tpl := s.hookTemplate(action, j)
	body := copyObj(tpl)
	body["action"] = action
	for k, v := range s.envelope() {
		body[k] = v
	}
	delete(body, "installation")
	wj := obj(body, "workflow_job")
	s.fillJob(wj, j, s.apiBaseLocked())
	if action == "queued" {
		wj["steps"] = []any{}
	}
	return body
}

// sharedFixtures is ../shared/fixtures/github beside the repository root.
func sharedFixtures(t *testing.T) string {
	return filepath.Join(testkit.RepoRoot(t), "..", "shared", "fixtures", "github")
}
