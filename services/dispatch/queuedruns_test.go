package dispatch_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/dispatch"
)

// runsAPI serves n queued runs (ids 1..n, newest first, as GitHub lists
// them, 100 a page with a Link header) each holding one queued job of the
// same id, and counts the calls.
func runsAPI(t *testing.T, n int) (*dispatch.GitHubMinter, *int) {
	t.Helper()
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/jobs") {
			run := strings.Split(r.URL.Path, "/")[6]
			fmt.Fprintf(w, `{"total_count":1,"jobs":[{"id":%s,"run_id":%s,"status":"queued","labels":["linux"]}]}`, run, run)
			return
		}
		if r.URL.Query().Get("status") != "queued" {
			w.Write([]byte(`{"total_count":0,"workflow_runs":[]}`))
			return
		}
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		page = max(page, 1)
		last := (n + 99) / 100
		if page < last {
			w.Header().Set("Link", fmt.Sprintf(`<%s%s?page=%d&status=queued>; rel="next", <%s%s?page=%d&status=queued>; rel="last"`,
				"http://"+r.Host, r.URL.Path, page+1, "http://"+r.Host, r.URL.Path, last))
		}
		var runs []map[string]any
		for id := n - (page-1)*100; id > max(0, n-page*100); id-- {
			runs = append(runs, map[string]any{"id": id})
		}
		json.NewEncoder(w).Encode(map[string]any{"total_count": n, "workflow_runs": runs})
	}))
	t.Cleanup(srv.Close)
	gh, _ := dispatch.NewGitHubClient(srv.URL, "t", nil)
	return &dispatch.GitHubMinter{Client: gh, Scope: "org", Org: "example-org"}, &calls
}

// Given 150 queued runs over two pages, when the scale set reconciler
// searches with 6 calls, then it reads the oldest runs first (the jobs
// waiting longest are those a lost message hides), spends no more calls
// than given, lists included, and skips the runs it is told are clean,
// so the next search goes further back in the queue.
func TestTheQueuedRunSearchReadsOldestFirstWithinItsCalls(t *testing.T) {
	m, calls := runsAPI(t, 150)
	jobs, read, err := m.QueuedJobsIn(t.Context(), "o", "r", 6, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(read, []int64{1, 2, 3, 4}) || len(jobs) != 4 || *calls != 6 {
		t.Fatalf("read runs %v (%d jobs) in %d calls; want runs 1-4 in 6 calls (2 lists, 4 runs)", read, len(jobs), *calls)
	}
	clean := map[int64]bool{1: true, 2: true, 3: true, 4: true}
	_, read, err = m.QueuedJobsIn(t.Context(), "o", "r", 6, func(run int64) bool { return clean[run] })
	if err != nil || !slices.Equal(read, []int64{5, 6, 7, 8}) {
		t.Fatalf("with runs 1-4 clean, read %v (%v); want 5-8", read, err)
	}
}
