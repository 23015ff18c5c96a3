package dispatch_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-github/v62/github"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// byGoGitHub is the fact as go-github's whole WorkflowJobEvent gives it:
// what the intake stored before it decoded only the fields it keeps.
func byGoGitHub(t testing.TB, delivery string, payload []byte) events.Payload {
	t.Helper()
	parsed, err := github.ParseWebHook("workflow_job", payload)
	if err != nil {
		t.Fatal(err)
	}
	e := parsed.(*github.WorkflowJobEvent)
	j := e.GetWorkflowJob()
	ref := events.JobRef{Delivery: delivery, JobID: j.GetID(), RunID: j.GetRunID(), RunAttempt: j.GetRunAttempt(),
		Org: e.GetRepo().GetOwner().GetLogin(), Repo: e.GetRepo().GetName(), Name: j.GetName(), Labels: j.Labels, Installation: "acme"}
	if ref.Labels == nil {
		ref.Labels = []string{}
	}
	switch e.GetAction() {
	case "queued":
		return events.JobQueued{JobRef: ref}
	case "waiting":
		return events.JobWaiting{JobRef: ref}
	case "in_progress":
		return events.JobInProgress{JobRef: ref, RunnerName: j.GetRunnerName(), RunnerID: j.GetRunnerID()}
	case "completed":
		return events.JobCompleted{JobRef: ref, Conclusion: j.GetConclusion(), RunnerName: j.GetRunnerName(), RunnerID: j.GetRunnerID()}
	}
	return nil
}

// Given every workflow_job payload GitHub sent (the shared fixtures), when
// the intake decodes only the fields it keeps, then the fact is the one
// go-github's whole event gives, field for field.
func TestTheIntakesDecodingKeepsWhatGoGitHubReads(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "..", "shared", "fixtures", "github", "webhooks")
	names, err := filepath.Glob(filepath.Join(dir, "workflow_job.*.json"))
	if err != nil || len(names) < 5 {
		t.Fatalf("workflow_job fixtures: %v, %v", names, err)
	}
	for _, name := range names {
		payload, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := dispatch.JobFactOf("d-1", payload, "acme")
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(name), err)
		}
		if want := byGoGitHub(t, "d-1", payload); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got  %+v\n want %+v", filepath.Base(name), got, want)
		}
	}
}

// BenchmarkDecodeWorkflowJob is one webhook's payload turned into its fact:
// the intake's decoding against go-github's whole event.
func BenchmarkDecodeWorkflowJob(b *testing.B) {
	payload := fixture(b, "workflow_job.completed.success.json")
	if !strings.Contains(string(payload), `"workflow_job"`) {
		b.Fatal("not a workflow_job payload")
	}
	b.Run("intake", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := dispatch.JobFactOf("d-1", payload, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go-github", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			byGoGitHub(b, "d-1", payload)
		}
	})
}
