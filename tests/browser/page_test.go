// Package browser drives the operator's page (services/page) in a real
// headless Chromium, through chromedp, during a short demo run.
package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/tests/harness"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"
)

// chromium finds the browser (BERTH_CHROMIUM, else Debian's chromium or a
// Chrome on PATH). Without one the test skips, or fails when CI is set:
// on CI a missing browser is a broken runner (.ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BERTH_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium on PATH (apt-get install chromium, or set BERTH_CHROMIUM)"
	if os.Getenv("CI") != "" {
		t.Fatalf("%s; CI is set, so this fails: .ci/run installs Debian's chromium", msg)
	}
	t.Skipf("%s; skipping (with CI set this fails)", msg)
	return ""
}

// pageState is what the page shows: its log sequence and each pool's
// held slots and capacity, read from the DOM.
type pageState struct {
	Seq   uint64                    `json:"seq"`
	Pools map[string]map[string]int `json:"pools"`
}

const readState = `(() => {
  const pools = {};
  for (const tr of document.querySelectorAll('#pools tr[data-pool]')) {
    pools[tr.dataset.pool] = {held: parseInt(tr.querySelector('td.held').textContent),
                              capacity: parseInt(tr.querySelector('td.capacity').textContent)};
  }
  return {seq: parseInt(document.querySelector('[data-seq]').dataset.seq), pools};
})()`

// Given a short demo run, when an operator opens the page in a browser,
// then each pool's held slots and capacity are those of `berth status
// --json` at the page's sequence; a release shows without a reload; a job
// links to its timeline of facts; and a screenshot is saved.
func TestThePageInABrowserDuringADemo(t *testing.T) {
	chrome := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	o := harness.Options{Jobs: 40, MacOSShare: 0.3, FailShare: 0.1, Seed: 11, MinDuration: 2 * time.Second, MaxDuration: 4 * time.Second,
		Arrival: 4 * time.Second, DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", Timeout: 3 * time.Minute}
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.Stop(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	nc, js, err := eventlog.Connect(f.Sys.NATSURL, "browser-test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	driven := make(chan error, 1)
	go func() { _, err := f.Drive(ctx, o); driven <- err }()

	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.WindowSize(1280, 1500), chromedp.Flag("disable-gpu", true))...)
	defer acancel()
	b, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	url := "http://" + f.Sys.PageAddr + "/"
	if err := chromedp.Do(b, chromedp.Navigate(url), chromedp.WaitVisible("#pools"),
		void(chromedp.Evaluate[int](`window.berthNoReload = 42`)),
		void(chromedp.Poll[bool](`document.getElementById("conn").textContent === "live"`, chromedp.WithPollingTimeout(15*time.Second)))); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}

	pool, held := matchesStatus(t, ctx, b, js)
	shot(t, b, "busy")

	// A release: the pool's held count falls below what it was, pushed
	// over the stream into the same document (the marker survives).
	falls := fmt.Sprintf(`parseInt(document.querySelector('#pools tr[data-pool="%s"] td.held').textContent) < %d`, pool, held)
	start := time.Now()
	if _, err := chromedp.Run(b, chromedp.Poll[bool](falls, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		t.Fatalf("pool %s never showed fewer than %d held slots: %v", pool, held, err)
	}
	same, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.berthNoReload === 42`))
	if err != nil {
		t.Fatal(err)
	}
	if !same {
		t.Fatal("the page reloaded to show the release; it should arrive over the stream")
	}
	t.Logf("pool %s fell below %d held slots on the page %s later, without a reload", pool, held, time.Since(start).Round(time.Millisecond))

	if err := <-driven; err != nil {
		t.Fatalf("the demo run: %v", err)
	}
	settledMatchesStatus(t, ctx, b, js)
	followAJob(t, b)
}

// matchesStatus waits until some pool holds slots on the page and checks,
// at each read, every pool's held and capacity against the status
// replayed at the page's sequence (what `berth status --json` printed
// then). It returns a pool with held slots and how many.
func matchesStatus(t *testing.T, ctx context.Context, b context.Context, js jetstream.JetStream) (string, int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ps, err := chromedp.Run(b, chromedp.Evaluate[pageState](readState))
		if err != nil {
			t.Fatal(err)
		}
		st, _, err := cli.ReplayStatus(ctx, js, ps.Seq, time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		compare(t, ps, st)
		for _, p := range st.Pools {
			if p.Held > 0 {
				return p.Name, p.Held
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no pool held a slot on the page within a minute of the demo's start")
		}
		if _, err := chromedp.Run(b, chromedp.Poll[bool](fmt.Sprintf(`parseInt(document.querySelector('[data-seq]').dataset.seq) > %d`, ps.Seq),
			chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			t.Fatalf("the page stayed at seq %d: %v", ps.Seq, err)
		}
	}
}

// settledMatchesStatus: once the run is over, the page reaches the log's
// end and shows what `berth status --json` prints.
func settledMatchesStatus(t *testing.T, ctx context.Context, b context.Context, js jetstream.JetStream) {
	t.Helper()
	st, err := cli.FleetStatus(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := cli.PrintStatus(&out, st, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	var printed events.Status
	if err := json.Unmarshal([]byte(out.String()), &printed); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(b, chromedp.Poll[bool](fmt.Sprintf(`parseInt(document.querySelector('[data-seq]').dataset.seq) >= %d`, printed.AsOfSeq),
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the page never reached seq %d: %v", printed.AsOfSeq, err)
	}
	ps, err := chromedp.Run(b, chromedp.Evaluate[pageState](readState))
	if err != nil {
		t.Fatal(err)
	}
	if ps.Seq != printed.AsOfSeq {
		t.Fatalf("the log grew after the run: page at %d, status at %d", ps.Seq, printed.AsOfSeq)
	}
	compare(t, ps, printed)
}

func compare(t *testing.T, ps pageState, st events.Status) {
	t.Helper()
	if len(ps.Pools) != len(st.Pools) {
		t.Fatalf("page shows pools %v at seq %d, status %d pools", ps.Pools, ps.Seq, len(st.Pools))
	}
	for _, p := range st.Pools {
		got := ps.Pools[p.Name]
		if got == nil || got["held"] != p.Held || got["capacity"] != p.Capacity {
			t.Fatalf("at seq %d pool %s shows %v on the page, status says held %d of %d", ps.Seq, p.Name, got, p.Held, p.Capacity)
		}
	}
}

// followAJob clicks the first recent job and reads its timeline.
func followAJob(t *testing.T, b context.Context) {
	t.Helper()
	err := chromedp.Do(b, chromedp.Click(`table.jobs tr[data-job] a`), chromedp.WaitVisible(`#timeline`))
	if err != nil {
		t.Fatalf("follow a job to its timeline: %v", err)
	}
	facts, err := chromedp.Run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#timeline tr[data-fact]')].map(tr => tr.dataset.fact)`))
	if err != nil {
		t.Fatalf("follow a job to its timeline: %v", err)
	}
	joined := " " + strings.Join(facts, " ") + " "
	for _, want := range []string{" job.queued ", " attempt.placed ", " job.completed "} {
		if !strings.Contains(joined, want) {
			t.Errorf("timeline %v lacks %s", facts, strings.TrimSpace(want))
		}
	}
	shot(t, b, "job")
}

// shot saves a PNG of the browser's window (1280×1500) to the test's
// artifact directory (go test -artifacts keeps it), and to
// BERTH_PAGE_SCREENSHOT_DIR when set (docs/page.png is one).
func shot(t *testing.T, b context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(b, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	for _, dir := range []string{t.ArtifactDir(), os.Getenv("BERTH_PAGE_SCREENSHOT_DIR")} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, "page-"+name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d KB)", p, len(png)/1024)
	}
}

// void drops an action's result, for a sequence of steps (chromedp.Do).
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}
