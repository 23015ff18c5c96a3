package page_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/page"
	"github.com/berth-ci/berth/services/testkit"
)

// Given job 7's facts in the log (queued, its attempt booked and placed,
// then in progress and completed) beside another job's, when an operator
// follows job 7 from the page, then its timeline lists its own facts in
// log order (its slot's booking and release among them, though they stand
// on the pool's subject), each with its attempt and host, and its
// attempt's outcome; none of job 8's.
func TestAJobsTimelineIsItsFactsFromTheLog(t *testing.T) {
	js, app := testkit.Log(t, "berth/dispatcher")
	app.Role = events.RoleDispatcher
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := events.AttemptID(7, 1)
	h := testkit.History().HostOnline("host-a", 4, 4).Queued(7).Queued(8).Reserved(7, 1, "host-a").Placed(7, 1, "host-a").
		InProgress(7, a).Completed(7, a, "failure").Released(7, 1, "host-a", events.ReleaseCompleted)
	// The fold is the stored facts' (the timeline finds slot facts by the
	// sequences the fold recorded for them).
	stored := events.NewFleet()
	for _, e := range h.Events() {
		if e.Type() == events.TypeHostOnline {
			stored.Apply(e) // an agent's fact; the timeline reads job, attempt and slot facts
			continue
		}
		ev := app.New(e.Time, e.Data)
		seq, _, err := app.Append(ctx, ev, nil)
		if err != nil {
			t.Fatalf("append %s: %v", e.Type(), err)
		}
		ev.Seq = seq
		stored.Apply(ev)
	}
	srv := start(t, &fold{h: h, f: stored}, page.Options{JS: js})
	code, html := get(t, srv.Client(), srv.URL+"/job/7")
	if code != http.StatusOK {
		t.Fatalf("GET /job/7 = %d:\n%s", code, html)
	}
	facts := regexp.MustCompile(`<tr data-fact="([^"]+)">`).FindAllStringSubmatch(html, -1)
	var got []string
	for _, f := range facts {
		got = append(got, f[1])
	}
	want := []string{"job.queued", "slot.reserved", "attempt.placed", "job.in_progress", "job.completed", "slot.released"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("timeline %v, want %v", got, want)
	}
	placed := regexp.MustCompile(`(?s)<tr data-fact="attempt.placed">(.*?)</tr>`).FindStringSubmatch(html)[1]
	if !strings.Contains(placed, "<code>"+a+"</code>") || !strings.Contains(placed, "<td>host-a</td>") || !strings.Contains(placed, "<td>dispatcher</td>") {
		t.Errorf("placed row lacks its attempt, host or author: %s", placed)
	}
	for _, slot := range []string{"slot.reserved", "slot.released"} {
		row := regexp.MustCompile(`(?s)<tr data-fact="` + regexp.QuoteMeta(slot) + `">(.*?)</tr>`).FindStringSubmatch(html)[1]
		if !strings.Contains(row, "<code>"+a+"</code>") || !strings.Contains(row, "<td>host-a</td>") || !strings.Contains(row, "<td>dispatcher</td>") {
			t.Errorf("%s row lacks its attempt, host or author (they are in its payload and subject): %s", slot, row)
		}
	}
	if !strings.Contains(html, "conclusion=failure") {
		t.Error("completion's conclusion not shown")
	}
	if !strings.Contains(html, "slot released: completed") {
		t.Errorf("attempt's outcome not shown:\n%s", html)
	}
	if code, _ := get(t, srv.Client(), srv.URL+"/job/99"); code != http.StatusNotFound {
		t.Errorf("unknown job: %d, want 404", code)
	}
	if code, _ := get(t, srv.Client(), srv.URL+"/job/x"); code != http.StatusBadRequest {
		t.Errorf("malformed job id: %d, want 400", code)
	}
}
