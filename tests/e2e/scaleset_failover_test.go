package e2e

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/google/go-github/v62/github"
	"github.com/nats-io/nats.go"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/setintake"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
)

// replica is one dispatcher replica's scale set intake: its own NATS
// connection and its own way to GitHub (a proxy the test can cut), so
// killing it leaves its session open on GitHub and its lease unrenewed,
// as a SIGKILL would.
type replica struct {
	in     *setintake.Intake
	nc     *nats.Conn
	proxy  *httptest.Server
	cut    atomic.Bool
	cancel context.CancelFunc
}

func (r *replica) kill() {
	r.cut.Store(true)
	r.nc.Close()
}

// staticFold is a fold with one host, granted what it claims, offering the linux pool 100 slots.
func staticFold() func(context.Context, func(*events.Fleet)) error {
	f := events.NewFleet()
	ev := events.New("test", time.Now(), &events.HostOnline{Host: "host-a", Boot: "b1", PhysicalCap: 100, CurveKey: "curve",
		Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"self-hosted", "linux"}, Slots: 100}}, At: time.Now()})
	ev.Seq = 1
	testkit.ApplyGranted(f, ev) // the admin grants it what it claims
	var mu sync.Mutex
	return func(_ context.Context, fn func(*events.Fleet)) error {
		mu.Lock()
		defer mu.Unlock()
		fn(f)
		return nil
	}
}

func startReplica(t *testing.T, ctx context.Context, natsURL string, sim *ghsim.Sim, name string, read func(context.Context, func(*events.Fleet)) error) *replica {
	t.Helper()
	r := &replica{}
	fwd := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.Out.URL = pr.In.URL; pr.Out.Host = pr.In.Host }}
	r.proxy = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.cut.Load() {
			http.Error(w, "replica killed", http.StatusBadGateway)
			return
		}
		fwd.ServeHTTP(w, req)
	}))
	proxyURL, _ := url.Parse(r.proxy.URL)
	cfgURL := sim.URL() + "/example-org"
	client, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL: cfgURL, PersonalAccessToken: "ghp_test", SystemInfo: scaleset.SystemInfo{System: "berth-test"}},
		scaleset.WithRetryMax(1), scaleset.WithRetryWaitMax(50*time.Millisecond),
		scaleset.WithProxy(func(*http.Request) (*url.URL, error) { return proxyURL, nil }))
	if err != nil {
		t.Fatal(err)
	}
	nc, js, err := eventlog.Connect(natsURL, name)
	if err != nil {
		t.Fatal(err)
	}
	r.nc = nc
	kv, err := eventlog.OpenBucket(ctx, js, events.BucketScaleSets, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.in = &setintake.Intake{Client: client, Log: &eventlog.Appender{JS: js, Source: "berth/" + name, Role: events.RoleDispatcher},
		KV: kv, Read: read, Pools: []string{"linux"}, Owner: name, LeaseTTL: time.Second,
		Stale:  &setintake.Registration{ConfigURL: cfgURL, RegistrationToken: setintake.RegistrationTokenFrom(restClient(t, sim), cfgURL)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: &setintake.Metrics{}}
	return r
}

// restClient is go-github pointed at the simulator's REST API, as a GitHub
// App's installation client is: the replicas make registration tokens
// with it to delete a dead holder's session.
func restClient(t *testing.T, sim *ghsim.Sim) *github.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := github.NewClient(&http.Client{Transport: tr}).WithAuthToken("ghs_installation")
	u, err := url.Parse(sim.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	c.BaseURL = u
	return c
}

// Given three replicas of the scale set intake, when the one holding the
// session is killed mid-stream (its session left open on GitHub, its lease
// no longer renewed), then another takes the set over within 10 s (after
// deleting the stale session GitHub answers 409 for), resumes from the
// stored cursor, and every job's fact is in the log exactly once.
func TestScaleSetFailoverResumesWithinSeconds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	fixtures, err := harness.FixturesDir(root)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsembed.StartEmbedded(natsembed.EmbeddedConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, js, err := eventlog.Connect(srv.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stream, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := ghsim.New(ghsim.Config{Org: "example-org", Repo: "example-repo", FixturesDir: fixtures, AcquireTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	read := staticFold()
	var wg sync.WaitGroup
	reps := map[string]*replica{}
	for _, name := range []string{"replica-1", "replica-2", "replica-3"} {
		r := startReplica(t, ctx, srv.ClientURL(), sim, name, read)
		rctx, rcancel := context.WithCancel(ctx)
		r.cancel = rcancel
		reps[name] = r
		wg.Go(func() { _ = r.in.Run(rctx) })
	}
	defer func() {
		for _, r := range reps {
			r.cancel()
		}
		wg.Wait()
		for _, r := range reps {
			r.proxy.Close()
			r.nc.Close()
		}
	}()
	owner := func() string { s, _ := linuxSet(sim); return s.SessionOwner }
	testkit.Eventually(t, 20*time.Second, "one replica opens the session", func() bool { return owner() != "" })
	holder := owner()
	const jobs = 40
	for range jobs / 2 {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}})
	}
	testkit.Eventually(t, 20*time.Second, "the holder stores some facts", func() bool { return reps[holder].in.Metrics.Facts.Load() >= 5 })
	reps[holder].kill()
	killed := time.Now()
	for range jobs / 2 {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}})
	}
	testkit.Eventually(t, 10*time.Second, "another replica takes the session over", func() bool {
		o := owner()
		return o != "" && o != holder
	})
	t.Logf("%s took over from %s after %v", owner(), holder, time.Since(killed).Round(time.Millisecond))
	testkit.Eventually(t, 30*time.Second, "every job's fact is stored", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs >= jobs
	})
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != jobs {
		t.Errorf("the log holds %d facts for %d jobs: each must be stored once", info.State.Msgs, jobs)
	}
	f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range sim.Jobs() {
		if fj := f.Jobs[j.ID]; fj == nil || fj.Status != events.StatusQueued {
			t.Errorf("job %d: fold has %+v; want it queued", j.ID, fj)
		}
	}
}
