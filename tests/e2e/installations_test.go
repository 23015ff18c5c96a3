package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
)

// globexLabels are the labels both installations' pools give their
// runners: overlapping on purpose.
var globexLabels = []string{"self-hosted", "linux", "x64"}

// twoInstallations is the demo fleet with a second GitHub installation,
// globex, behind a simulator of its own: its webhook reaches
// /webhook/globex with its own secret, and each host gains a pool
// globex-linux with the same labels as linux, serving only globex.
func twoInstallations(t *testing.T) (harness.Options, func() *ghsim.Sim) {
	var globex *ghsim.Sim
	o := demoOptions(t, 0)
	o.Tune = func(c *config.Config) {
		fixtures, err := harness.FixturesDir(mustRoot(t))
		if err != nil {
			t.Fatal(err)
		}
		// Its webhook URL is set once the dispatcher listens: it binds
		// any free port (the test, after harness.Start).
		globex, err = ghsim.New(ghsim.Config{WebhookSecret: "globex-secret",
			Org: "globex-org", Repo: "globex-app", FixturesDir: fixtures, AcquireTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		url, err := globex.Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { globex.Close() })
		c.Dispatcher.GitHub.More = []config.GitHub{{Name: "globex", APIURL: url, Token: "globex-token", Scope: "org",
			Org: "globex-org", Intake: config.IntakeWebhooks, WebhookSecret: "globex-secret"}}
		c.Dispatcher.ReconcileEvery = time.Second
		for i := range c.Agents {
			c.Agents[i].Pools["globex-linux"] = config.Pool{Labels: globexLabels, Slots: 2, Installation: "globex"}
			c.Agents[i].PhysicalCap += 2
		}
	}
	return o, func() *ghsim.Sim { return globex }
}

func mustRoot(t *testing.T) string {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Given two installations whose pools share labels, and globex's JIT
// config route rate-limited for 20 s, when globex's jobs arrive first and
// then the default installation's: the default's jobs are all served while
// globex waits out its own reset (its budget is its own: /healthz says
// globex is paused and the default is not), then globex's are served; and
// every job ran exactly once on a runner of its own installation's pool.
func TestTwoInstallationsServeOnlyTheirOwnJobsEachWithItsOwnBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o, globexSim := twoInstallations(t)
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	acme, globex := f.Sim, globexSim()
	globex.SetWebhookURL("http://" + f.Sys.DispatcherAddr + "/webhook/globex")
	const wait = 20 * time.Second
	// Every call refused until the reset: the first round mints for all
	// of globex's jobs at once, before the first refusal pauses it.
	globex.RateLimit(ghsim.RouteJITConfigOrg, ghsim.PrimaryLimit, -1, wait)
	limited := time.Now()
	spec := ghsim.JobSpec{Labels: globexLabels, Duration: 200 * time.Millisecond}
	for range 4 {
		globex.Enqueue(spec)
	}
	testkit.Eventually(t, 30*time.Second, "globex's JIT config route refused once", func() bool {
		return globex.APICalls()[ghsim.RouteJITConfigOrg] >= 1
	})
	for range 8 {
		acme.Enqueue(spec)
	}
	testkit.Eventually(t, 60*time.Second, "the default installation's 8 jobs completed", func() bool {
		return completed(acme.Jobs()) == 8
	})
	reset := limited.Add(wait)
	if time.Now().After(reset) {
		t.Fatalf("the default installation's jobs completed only after globex's reset (%s): globex's rate limit held them", reset.Format(time.TimeOnly))
	}
	health := dispatcherHealth(t, f)
	if health["github_paused_globex"] == "" || health["github_paused"] != "" {
		t.Errorf("/healthz during globex's wait: github_paused %q, github_paused_globex %q: want only globex paused",
			health["github_paused"], health["github_paused_globex"])
	}
	for _, j := range globex.Jobs() {
		if j.Status != "queued" {
			t.Errorf("globex job %d is %s before its installation's reset", j.ID, j.Status)
		}
	}
	testkit.Eventually(t, wait+60*time.Second, "globex's 4 jobs completed after its reset", func() bool {
		return completed(globex.Jobs()) == 4
	})
	pools := map[string]string{} // runner (attempt) → pool
	testkit.Eventually(t, 30*time.Second, "every slot released", func() bool {
		st, err := f.Status(ctx)
		held := 0
		for _, p := range st.Pools {
			held += p.Held - p.WarmIdle
		}
		_ = f.Sys.Dispatcher.Read(ctx, func(fl *events.Fleet) {
			for id, a := range fl.Attempts {
				pools[id] = a.Pool
			}
		})
		return err == nil && held == 0
	})
	for sim, want := range map[*ghsim.Sim]string{acme: "linux", globex: "globex-linux"} {
		for _, j := range sim.Jobs() {
			if j.Completions != 1 || !strings.HasPrefix(j.RunnerName, "berth-") {
				t.Errorf("job %d: %d completions on runner %q, want 1 on a Berth runner", j.ID, j.Completions, j.RunnerName)
			}
			if got := pools[j.RunnerName]; got != want {
				t.Errorf("job %d ran on %s of pool %q, want its installation's pool %s", j.ID, j.RunnerName, got, want)
			}
		}
	}
}

func completed(jobs []ghsim.JobView) int {
	n := 0
	for _, j := range jobs {
		if j.Status == "completed" {
			n++
		}
	}
	return n
}

// dispatcherHealth is the dispatcher's /healthz detail.
func dispatcherHealth(t *testing.T, f *harness.Fleet) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + f.Sys.DispatcherAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(map[string]any)
	walk = func(m map[string]any) {
		for k, v := range m {
			switch v := v.(type) {
			case string:
				out[k] = v
			case map[string]any:
				walk(v)
			}
		}
	}
	walk(body)
	return out
}
