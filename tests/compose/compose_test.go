package compose_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
)

// The ha profile's services, as docker-compose.yml names them.
var (
	haNATS        = []string{"nats-1", "nats-2", "nats-3"}
	haDispatchers = []string{"dispatcher-1", "dispatcher-2"}
	haWatchdogs   = []string{"watchdog-1", "watchdog-2"}
	// haPortVar names the variable that moves a service's host port; the
	// test gives each a free port of its own, so that runs never collide.
	// (Not 0, Docker's "any free port": a container that restarts, as a
	// service does when it starts before the cluster has elected its meta
	// leader, would come back on another port.)
	haPortVar = func(svc string) string {
		return "BERTH_HA_" + strings.ToUpper(strings.ReplaceAll(svc, "-", "_")) + "_PORT"
	}
	// haPagePortVar names the variable that moves an ha dispatcher's
	// page (issue 21: the page works in compose, both stacks).
	haPagePortVar = func(svc string) string {
		return "BERTH_HA_" + strings.ToUpper(strings.ReplaceAll(svc, "-", "_")) + "_PAGE_PORT"
	}
)

// haPorts is each ha service's port variables with a port from next: the
// API's, then the page's for a dispatcher.
func haPorts(next func() int) (vars []string, ports map[string][]int) {
	ports = map[string][]int{}
	for _, svc := range slices.Concat(haNATS, haDispatchers, haWatchdogs) {
		names := []string{haPortVar(svc)}
		if slices.Contains(haDispatchers, svc) {
			names = append(names, haPagePortVar(svc))
		}
		for _, v := range names {
			p := next()
			ports[svc] = append(ports[svc], p)
			vars = append(vars, fmt.Sprintf("%s=%d", v, p))
		}
	}
	return vars, ports
}

// repoRoot is the directory of docker-compose.yml.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "docker-compose.yml")); err != nil {
		t.Fatalf("docker-compose.yml not found two levels up: %v", err)
	}
	return root
}

// unavailable skips the test, or fails it when CI is set: on CI a missing
// Docker is a broken runner, not a reason to pass.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s; CI is set, so this fails: the compose tests need the Docker engine and docker-compose >= 1.28", msg)
	}
	t.Skipf("%s; skipping (with CI set this fails)", msg)
}

// composeCommand finds docker-compose >= 1.28 (profiles) or the docker
// compose plugin.
func composeCommand(t testing.TB) []string {
	t.Helper()
	var why []string
	if p, err := exec.LookPath("docker-compose"); err == nil {
		out, err := exec.Command(p, "version", "--short").Output()
		v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
		if err == nil && profilesSupported(v) {
			return []string{p}
		}
		why = append(why, fmt.Sprintf("docker-compose %q (%v) is older than 1.28 and knows no profiles", v, err))
	} else {
		why = append(why, "no docker-compose on PATH")
	}
	if out, err := exec.Command("docker", "compose", "version", "--short").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		return []string{"docker", "compose"}
	}
	why = append(why, "no `docker compose` plugin")
	unavailable(t, "%s", strings.Join(why, "; "))
	return nil
}

func profilesSupported(v string) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return err1 == nil && err2 == nil && (major > 1 || major == 1 && minor >= 28)
}

// needEngine checks that the Docker engine answers.
func needEngine(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
	if err != nil {
		unavailable(t, "the Docker engine is not reachable (`docker info`: %v: %s)", err, strings.TrimSpace(string(out)))
	}
}

// composeEnv is the environment docker-compose runs with: the ha ports
// reset to defaults (or to extra), nothing else changed.
func composeEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BERTH_HA_") && !strings.HasPrefix(kv, "COMPOSE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// Given docker-compose.yml, when it is read without a profile and with the
// ha profile, then both are valid; the default stack is exactly nats,
// dispatcher and watchdog on their usual ports; every ha service is in the
// ha profile on ports of its own; and the files the ha services mount agree
// with the service names (cluster routes, server names, NATS URLs, replicas).
func TestComposeConfig(t *testing.T) {
	cmd := composeCommand(t)
	root := repoRoot(t)
	read := func(profile bool, env ...string) map[string]composeService {
		t.Helper()
		args := append(slices.Clone(cmd[1:]), "-f", filepath.Join(root, "docker-compose.yml"))
		if profile {
			args = append(args, "--profile", "ha")
		}
		c := exec.Command(cmd[0], append(args, "config")...)
		c.Dir, c.Env = root, composeEnv(env...)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s config (profile ha: %v) is invalid: %v\n%s", strings.Join(cmd, " "), profile, err, stderr.String())
		}
		var f struct {
			Services map[string]composeService `yaml:"services"`
		}
		if err := yaml.Unmarshal(out, &f); err != nil {
			t.Fatalf("docker-compose config printed what is not YAML: %v\n%s", err, out)
		}
		return f.Services
	}
	def := read(false)
	_ = read(true)
	// Each ha host port moves with its variable (the ha test relies on it).
	n := 40000
	moved, movedTo := haPorts(func() int { n++; return n })
	movedDef := read(true, moved...)
	for _, svc := range slices.Concat(haNATS, haDispatchers, haWatchdogs) {
		var want []string
		for _, p := range movedTo[svc] {
			want = append(want, fmt.Sprintf("127.0.0.1:%d", p))
		}
		if got := movedDef[svc].ports(t); !slices.Equal(got, want) {
			t.Errorf("%s with %v: publishes %v, want %v", svc, moved, got, want)
		}
	}

	var defaults []string
	hostPorts := map[string]string{}
	for name, s := range def {
		if len(s.Profiles) == 0 {
			defaults = append(defaults, name)
		}
		for _, p := range s.ports(t) {
			if other, dup := hostPorts[p]; dup {
				t.Errorf("host port %s is published by both %s and %s: the default stack and the ha profile must be able to run side by side", p, other, name)
			}
			hostPorts[p] = name
		}
	}
	slices.Sort(defaults)
	if want := []string{"agent", "dispatcher", "nats", "stream-apply", "watchdog"}; !slices.Equal(defaults, want) {
		t.Errorf("services without a profile (the default stack): %v, want %v", defaults, want)
	}
	for svc, want := range map[string][]string{
		"nats":       {"127.0.0.1:4222", "127.0.0.1:8222"},
		"dispatcher": {"127.0.0.1:8080", "127.0.0.1:8090"},
		"watchdog":   {"127.0.0.1:8081"},
		"agent":      {"127.0.0.1:8086"},
	} {
		if got := def[svc].ports(t); !slices.Equal(got, want) {
			t.Errorf("default %s publishes %v, want %v", svc, got, want)
		}
	}
	for _, svc := range slices.Concat(haNATS, haDispatchers, haWatchdogs) {
		s, ok := def[svc]
		if !ok {
			t.Errorf("no service %s in docker-compose.yml", svc)
			continue
		}
		if !slices.Equal(s.Profiles, []string{"ha"}) {
			t.Errorf("%s: profiles %v, want [ha]", svc, s.Profiles)
		}
		if len(s.ports(t)) == 0 {
			t.Errorf("%s publishes no host port: the test (and operators) reach it from the host", svc)
		}
	}

	// The nats nodes' configs: server_name is the service name, routes go to
	// the three services, the store is on the node's volume.
	for _, svc := range haNATS {
		conf := def[svc].mount(t, "/etc/nats/nats.conf")
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Fatalf("%s: %s: %v", svc, conf, err)
		}
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		if opts.ServerName != svc || !opts.JetStream || opts.Cluster.Name == "" ||
			!slices.Equal(routes, []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}) || !strings.HasPrefix(opts.StoreDir, "/data/") {
			t.Errorf("%s: %s: server_name %q, jetstream %v, cluster %q, routes %v, store %q; want the service name, a cluster routed to nats-1..3:6222, the store under /data",
				svc, conf, opts.ServerName, opts.JetStream, opts.Cluster.Name, routes, opts.StoreDir)
		}
	}
	// The dispatchers' and watchdogs' config: all three nodes, three replicas.
	for _, svc := range slices.Concat(haDispatchers, haWatchdogs) {
		path := def[svc].mount(t, "/etc/berth/berth.yaml")
		c, err := config.Load(path)
		if err != nil {
			t.Fatalf("%s: %s: %v", svc, path, err)
		}
		if c.NATS.Replicas != 3 || c.NATS.URL != "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222" {
			t.Errorf("%s: %s: nats.url %q, replicas %d; want the three nodes and 3", svc, path, c.NATS.URL, c.NATS.Replicas)
		}
	}
}

// composeService is the part of `docker-compose config` the test reads.
type composeService struct {
	Profiles []string `yaml:"profiles"`
	Ports    []any    `yaml:"ports"`   // "127.0.0.1:8080:8080/tcp" (v1) or a mapping (v2)
	Volumes  []any    `yaml:"volumes"` // "src:dst:ro" (v1) or a mapping (v2)
}

// ports returns the published host addresses, "ip:port".
func (s composeService) ports(t testing.TB) []string {
	var out []string
	for _, p := range s.Ports {
		switch p := p.(type) {
		case string:
			parts := strings.Split(strings.TrimSuffix(p, "/tcp"), ":")
			if len(parts) != 3 {
				t.Fatalf("port %q: want ip:host:container", p)
			}
			out = append(out, parts[0]+":"+parts[1])
		case map[string]any:
			out = append(out, fmt.Sprintf("%v:%v", p["host_ip"], p["published"]))
		}
	}
	slices.Sort(out)
	return out
}

// mount returns the host file mounted at target.
func (s composeService) mount(t testing.TB, target string) string {
	t.Helper()
	for _, v := range s.Volumes {
		switch v := v.(type) {
		case string:
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == target {
				return parts[0]
			}
		case map[string]any:
			if v["target"] == target {
				return fmt.Sprint(v["source"])
			}
		}
	}
	t.Fatalf("nothing is mounted at %s (volumes %v)", target, s.Volumes)
	return ""
}

// stack is one run of docker-compose.yml under a project name of its own,
// with the ha profile or an env file (the demo's).
type stack struct {
	cmd     []string
	root    string
	project string
	env     []string
	envFile string // given as --env-file; empty: the ha profile
}

func (s *stack) compose(ctx context.Context, args ...string) (string, error) {
	full := slices.Clone(s.cmd[1:])
	if s.envFile != "" {
		full = append(full, "--env-file", s.envFile)
	}
	full = append(full, "-f", filepath.Join(s.root, "docker-compose.yml"), "-p", s.project)
	if s.envFile == "" {
		full = append(full, "--profile", "ha")
	}
	c := exec.CommandContext(ctx, s.cmd[0], append(full, args...)...)
	c.Dir, c.Env = s.root, s.env
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w\n%s", filepath.Base(s.cmd[len(s.cmd)-1]), strings.Join(args, " "), err, out.String())
	}
	return out.String(), err
}

// downAtCleanup takes the project down (volumes too) when the test ends,
// printing the services' logs first if it failed. how is what selects the
// stack on the command line, for the message telling how to remove it by hand.
func (s *stack) downAtCleanup(t *testing.T, how string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			out, err := s.compose(ctx, "logs", "--no-color", "--tail", "300")
			t.Logf("docker-compose logs (%v):\n%s", err, out)
		}
		start := time.Now()
		if _, err := s.compose(ctx, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Errorf("tearing down project %s: %v (remove by hand: docker-compose %s -p %s down -v)", s.project, err, how, s.project)
		} else {
			t.Logf("project %s down, volumes removed (%v)", s.project, time.Since(start).Round(100*time.Millisecond))
		}
	})
}

// lineLog writes a command's output to the test log line by line.
type lineLog struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (w *lineLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Logf("%s%s", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

func buildImages(t *testing.T, root string) {
	if os.Getenv("BERTH_COMPOSE_SKIP_BUILD") != "" {
		t.Log("BERTH_COMPOSE_SKIP_BUILD is set: using the berth/berth:local and berth/nats:local images as they are")
		return
	}
	start := time.Now()
	t.Log("building the images: make images (static binaries, FROM scratch; a few minutes on a cold Go cache)")
	c := exec.Command("make", "images")
	w := &lineLog{t: t, prefix: "  make images: "}
	c.Dir, c.Stdout, c.Stderr = root, w, w
	if err := c.Run(); err != nil {
		t.Fatalf("make images: %v", err)
	}
	t.Logf("images built in %v", time.Since(start).Round(100*time.Millisecond))
}

// berthCLI returns the berth command for this machine: the static binary
// `make images` just built when it can run here, else a fresh build.
func berthCLI(t *testing.T, root string) string {
	bin := filepath.Join(root, "bin", "images", "berth", "berth")
	if _, err := os.Stat(bin); err == nil && runtime.GOOS == "linux" {
		return bin
	}
	bin = filepath.Join(t.TempDir(), "berth")
	c := exec.Command("go", "build", "-o", bin, "./services/cmd/berth")
	c.Dir = root
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("go build berth: %v\n%s", err, out)
	}
	return bin
}

// streamInfo asks the cluster about BERTH_EVENTS.
func streamInfo(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

// settled: three replicas configured, a leader, and both followers current.
func settled(info *jetstream.StreamInfo) error {
	if info.Config.Replicas != 3 {
		return fmt.Errorf("stream at %d replicas, want 3", info.Config.Replicas)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return fmt.Errorf("stream has no leader")
	}
	if len(info.Cluster.Replicas) != 2 {
		return fmt.Errorf("leader %s with %d followers, want 2", info.Cluster.Leader, len(info.Cluster.Replicas))
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("follower %s: current %v, offline %v, lag %d", r.Name, r.Current, r.Offline, r.Lag)
		}
	}
	return nil
}

func peers(info *jetstream.StreamInfo) string {
	if info.Cluster == nil {
		return "no cluster info"
	}
	s := "leader " + info.Cluster.Leader
	for _, r := range info.Cluster.Replicas {
		s += fmt.Sprintf(", %s (current %v, offline %v)", r.Name, r.Current, r.Offline)
	}
	return s
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// get GETs url and decodes its JSON body into v (nil: the body is dropped).
func get(ctx context.Context, url string, v any) error {
	body, err := getBody(ctx, url)
	if err != nil || v == nil {
		return err
	}
	return json.Unmarshal([]byte(body), v)
}

// getBody is url's body, or an error naming its status when not 200.
func getBody(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, strings.TrimSpace(body.String()))
	}
	return body.String(), nil
}

// Given the ha profile up (3 NATS nodes, the stream at 3 replicas, two
// dispatchers, two watchdogs) and a fact appended with the berth CLI, when
// the container of the node that leads the stream is killed, then within
// seconds another node leads, the next fact appended with the CLI is stored
// exactly once, and every dispatcher and watchdog is healthy again and has
// folded that fact.
func TestHAProfileSurvivesTheStreamLeadersDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images and runs seven containers (about a minute)")
	}
	cmd := composeCommand(t)
	needEngine(t)
	root := repoRoot(t)
	begin := time.Now()
	buildImages(t, root)
	berth := berthCLI(t, root)

	s := &stack{cmd: cmd, root: root, project: fmt.Sprintf("berthha%d%d", os.Getpid(), time.Now().UnixNano()%1e6)}
	vars, all := haPorts(func() int { return testkit.FreePort(t) })
	ports, pages := map[string]int{}, map[string]string{}
	for svc, p := range all {
		ports[svc] = p[0]
		if len(p) > 1 {
			pages[svc] = fmt.Sprintf("http://127.0.0.1:%d/", p[1])
		}
	}
	s.env = composeEnv(append([]string{"BERTH_WEBHOOK_SECRET=compose-test"}, vars...)...)
	s.downAtCleanup(t, "--profile ha")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	since := func() string { return time.Since(begin).Round(100 * time.Millisecond).String() }

	// Naming the services starts the ha stack alone (their profile is
	// enabled by naming them; the nats nodes come as dependencies), not the
	// default stack with its fixed ports.
	t.Logf("[%s] up: project %s", since(), s.project)
	if _, err := s.compose(ctx, slices.Concat([]string{"up", "-d"}, haDispatchers, haWatchdogs)...); err != nil {
		t.Fatal(err)
	}
	var natsURLs []string
	for _, n := range haNATS {
		natsURLs = append(natsURLs, fmt.Sprintf("nats://127.0.0.1:%d", ports[n]))
	}
	urls := strings.Join(natsURLs, ",")
	services := map[string]string{}
	for _, svc := range slices.Concat(haDispatchers, haWatchdogs) {
		services[svc] = fmt.Sprintf("http://127.0.0.1:%d", ports[svc])
	}
	t.Logf("[%s] NATS %s; services %v", since(), urls, services)

	nc, err := nats.Connect(urls, nats.Name(t.Name()), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.Timeout(2*time.Second), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	took := testkit.Poll(t, ctx, 90*time.Second, 200*time.Millisecond, "BERTH_EVENTS at 3 replicas, all current", func(ctx context.Context) error {
		i, err := streamInfo(ctx, js)
		if err != nil {
			return err
		}
		info = i
		return settled(i)
	})
	t.Logf("[%s] stream settled after %v: %s", since(), took.Round(100*time.Millisecond), peers(info))
	healthy := func(ctx context.Context) error {
		for name, u := range services {
			if err := get(ctx, u+"/healthz", nil); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	}
	took = testkit.Poll(t, ctx, 60*time.Second, 200*time.Millisecond, "every dispatcher and watchdog /healthz 200", healthy)
	t.Logf("[%s] all four services healthy after %v more", since(), took.Round(100*time.Millisecond))

	// A host for the operator facts (berth cordon needs one the log knows):
	// announced as an agent would.
	// The operator grants it what it announces, as for every host it runs.
	const host = "ha-host"
	now := time.Now().UTC()
	online := events.HostOnline{Host: host, Boot: s.project, PhysicalCap: 1, Backend: "exec", At: now,
		Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"linux", "self-hosted"}, Slots: 1}}}
	granted := events.GrantClaim(online)
	// And a host nobody granted, over-claiming: its announcement is parked
	// and alarmed (the watchdogs' /healthz is 503 while the alarm stands,
	// by design). Once, such a host plus the leader's death below made the
	// dispatchers' /healthz time out: its stream check waited on the
	// election inside the request. The dispatchers' health must answer.
	const ungranted = "ha-ungranted"
	overclaim := online
	overclaim.Host, overclaim.Boot = ungranted, s.project+"-ungranted"
	for _, p := range []events.Payload{&granted, &online, &overclaim} {
		ev := events.New("berth/tests/compose", now, p)
		msg, opts, err := eventlog.StoredMsg(ev)
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = js.PublishMsg(pctx, msg, opts...)
		pcancel()
		if err != nil {
			t.Fatalf("announce %s: %v", host, err)
		}
	}

	cli := func(ctx context.Context, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, berth, append(args, "--nats", urls)...)
		c.Env = append(os.Environ(), "BERTH_NATS_URL=")
		out, err := c.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("berth %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return string(out), err
	}
	testkit.Poll(t, ctx, 30*time.Second, 200*time.Millisecond, "each dispatcher parks the ungranted host's claim", func(ctx context.Context) error {
		for _, svc := range haDispatchers {
			var st events.Status
			if err := get(ctx, services[svc]+"/status", &st); err != nil {
				return fmt.Errorf("%s: %w", svc, err)
			}
			i := slices.IndexFunc(st.Hosts, func(h events.HostStatus) bool { return h.Name == ungranted })
			offered := 0
			if i >= 0 {
				for _, n := range st.Hosts[i].Slots {
					offered += n
				}
			}
			if i < 0 || !st.Hosts[i].Ungranted || len(st.Hosts[i].Overclaim) == 0 || offered != 0 {
				return fmt.Errorf("%s: host %s not shown over-claiming and offered nothing", svc, ungranted)
			}
		}
		return nil
	})
	// answers asks each dispatcher's /healthz with a 3 s deadline; a
	// request that ran out of it is the failure this test exists for.
	answers := func(ctx context.Context) error {
		for _, svc := range haDispatchers {
			hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err := get(hctx, services[svc]+"/healthz", nil)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s /healthz did not answer within 3 s with an over-claim parked: %v", svc, err)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", svc, err)
			}
		}
		return nil
	}
	testkit.Poll(t, ctx, 30*time.Second, 200*time.Millisecond, "each dispatcher's /healthz 200 with an over-claim parked", answers)
	before, after := "before the leader died", "after the leader died"
	if out, err := cli(ctx, "cordon", host, "--reason", before); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("[%s] %s", since(), strings.TrimSpace(out))
	}

	// Kill the container of the node leading the stream.
	info, err = streamInfo(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	leader := info.Cluster.Leader
	if !slices.Contains(haNATS, leader) {
		t.Fatalf("stream leader %q is none of %v", leader, haNATS)
	}
	id, err := s.compose(ctx, "ps", "-q", leader)
	if err != nil || strings.TrimSpace(id) == "" {
		t.Fatalf("container of %s: %q %v", leader, id, err)
	}
	id = strings.TrimSpace(id)
	if out, err := exec.CommandContext(ctx, "docker", "kill", id).CombinedOutput(); err != nil {
		t.Fatalf("docker kill %s (%s): %v: %s", leader, id, err, out)
	}
	killed := time.Now()
	t.Logf("[%s] killed %s, the stream's leader (container %.12s)", since(), leader, id)

	took = testkit.Poll(t, ctx, 20*time.Second, 200*time.Millisecond, "a new stream leader", func(ctx context.Context) error {
		_ = answers(ctx) // during the election: a 503 may be right, no answer never is
		i, err := streamInfo(ctx, js)
		if err != nil {
			return err
		}
		if i.Cluster == nil || i.Cluster.Leader == "" || i.Cluster.Leader == leader {
			return fmt.Errorf("%s", peers(i))
		}
		info = i
		return nil
	})
	t.Logf("[%s] new leader after %v: %s", since(), took.Round(10*time.Millisecond), peers(info))
	took = testkit.Poll(t, ctx, 20*time.Second, 200*time.Millisecond, "each dispatcher's /healthz 200 after the election", answers)
	t.Logf("[%s] both dispatchers healthy %v after the new leader, the over-claim still parked", since(), took.Round(10*time.Millisecond))

	var tries int
	testkit.Poll(t, ctx, 20*time.Second, 200*time.Millisecond, "berth cordon after the kill", func(ctx context.Context) error {
		tries++
		out, err := cli(ctx, "cordon", host, "--reason", after)
		if err != nil {
			t.Logf("  try %d: %v", tries, err)
			return err
		}
		t.Logf("[%s] %s", since(), strings.TrimSpace(out))
		return nil
	})
	t.Logf("[%s] second fact appended %v after the kill (%d tries)", since(), time.Since(killed).Round(10*time.Millisecond), tries)

	// Each cordon is stored exactly once.
	out, err := cli(ctx, "events", "--host", host, "--json")
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var history []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var env struct {
			Type string `json:"type"`
			Data struct {
				Reason string `json:"reason"`
			} `json:"data"`
		}
		if err := json.Unmarshal(sc.Bytes(), &env); err != nil {
			t.Fatalf("berth events --json printed %q: %v", sc.Text(), err)
		}
		history = append(history, env.Type+" "+strconv.Quote(env.Data.Reason))
		if env.Type == events.TypeHostCordoned {
			count[env.Data.Reason]++
		}
	}
	t.Logf("facts on %s: %s", events.HostSubject(host), strings.Join(history, "; "))
	if count[before] != 1 || count[after] != 1 || len(count) != 2 {
		t.Fatalf("cordon facts by reason: %v; want each of %q and %q exactly once", count, before, after)
	}

	// The admin grants the over-claiming host what it claims: the
	// watchdogs clear its alarm, so every service can be healthy below.
	if out, err := cli(ctx, "trust", "host", ungranted, "--pool", "linux=1:linux,self-hosted", "--cap", "1"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("[%s] %s", since(), strings.TrimSpace(out))
	}

	// Every service is healthy and has folded the fact appended after the
	// kill: its follower found the new leader.
	testkit.Poll(t, ctx, 30*time.Second, 200*time.Millisecond, "every service healthy and past the second fact", func(ctx context.Context) error {
		if err := healthy(ctx); err != nil {
			return err
		}
		for name, u := range services {
			var st events.Status
			if err := get(ctx, u+"/status", &st); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			i := slices.IndexFunc(st.Hosts, func(h events.HostStatus) bool { return h.Name == host })
			if i < 0 || st.Hosts[i].CordonReason != after {
				return fmt.Errorf("%s answers /healthz 200 but its projection is still at seq %d, without the cordon appended "+
					"after the kill: its follower has not recovered from the leader change", name, st.AsOfSeq)
			}
		}
		return nil
	})
	t.Logf("[%s] all four services healthy and caught up %v after the kill", since(), time.Since(killed).Round(10*time.Millisecond))

	// Each dispatcher's page, published on the host's loopback, shows the
	// cordon appended after the kill: the page follows its replica's fold.
	testkit.Poll(t, ctx, 30*time.Second, 200*time.Millisecond, "each ha dispatcher's page shows the second cordon", func(ctx context.Context) error {
		for _, svc := range haDispatchers {
			body, err := getBody(ctx, pages[svc])
			if err != nil {
				return fmt.Errorf("%s's page: %w", svc, err)
			}
			if !strings.Contains(body, after) {
				return fmt.Errorf("%s's page at %s does not show host %s cordoned %q", svc, pages[svc], host, after)
			}
		}
		return nil
	})
	t.Logf("[%s] both dispatchers' pages show it: %v", since(), pages)

	// The live projections agree with a replay of the log.
	var check []string
	for _, name := range slices.Concat(haDispatchers, haWatchdogs) {
		check = append(check, "--service", services[name])
	}
	if out, err := cli(ctx, append([]string{"replay", "--check"}, check...)...); err != nil {
		t.Errorf("replay --check after the kill: %v", err)
	} else {
		t.Logf("[%s] berth replay --check: %s", since(), strings.TrimSpace(out))
	}

	// Where the KV buckets live. Known gap, reported rather than asserted
	// for now: the services create berth_heartbeats and berth_snapshots at
	// one replica whatever nats.replicas says, so when the killed node held
	// one of them it is unavailable until the node is back (for heartbeats:
	// agents cannot beat, and after host_ttl the watchdog would call their
	// hosts lost). Once the buckets follow nats.replicas, make this a check.
	for _, b := range []string{"KV_berth_snapshots", "KV_berth_heartbeats"} {
		kctx, kcancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := js.Stream(kctx, b)
		kcancel()
		switch {
		case err != nil:
			t.Logf("warning: %s unavailable with %s down: %v (the bucket has fewer than 3 replicas)", b, leader, err)
		case st.CachedInfo().Config.Replicas < 3:
			t.Logf("warning: %s at %d replica(s), on %s: it would be unavailable with that node down", b, st.CachedInfo().Config.Replicas, peers(st.CachedInfo()))
		default:
			t.Logf("%s: %d replicas, %s", b, st.CachedInfo().Config.Replicas, peers(st.CachedInfo()))
		}
	}

	// The killed node comes back (docker kill counts as a manual stop, so
	// the restart policy leaves it down) and catches up.
	if out, err := exec.CommandContext(ctx, "docker", "start", id).CombinedOutput(); err != nil {
		t.Fatalf("docker start %s: %v: %s", leader, err, out)
	}
	took = testkit.Poll(t, ctx, 60*time.Second, 200*time.Millisecond, leader+" back and current", func(ctx context.Context) error {
		i, err := streamInfo(ctx, js)
		if err != nil {
			return err
		}
		info = i
		return settled(i)
	})
	t.Logf("[%s] %s restarted and current after %v: %s", since(), leader, took.Round(100*time.Millisecond), peers(info))

	// How often Docker restarted each container (a service whose first
	// start found no JetStream meta leader yet exits and is restarted).
	if ids, err := s.compose(ctx, "ps", "-q"); err == nil {
		args := append([]string{"inspect", "--format", "{{.Name}} restarts={{.RestartCount}}"}, strings.Fields(ids)...)
		if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err == nil {
			t.Logf("containers: %s", strings.Join(strings.Fields(string(out)), " "))
		}
	}
	t.Logf("[%s] done", since())
}
