package e2e

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/ec2"
	"github.com/berth-ci/berth/services/vmagent/backends/ec2/ec2sim"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
)

// simUserData is the instance's user data in these tests: as cloud-init
// would, the fake EC2 runs it when the instance boots (ec2sim.RunUserData);
// it starts the simulated runner with the JIT config the agent put in the
// launch, and the instance powers off when the runner exits.
const simUserData = `#!/bin/sh
# Berth attempt {{.Attempt}} (pool {{.Pool}}, fleet {{.Fleet}})
set -eu
printf '%s\n' '{{.JITConfig}}' >"$INSTANCE_DIR/jitconfig"
exec "$BERTH_SIM_RUNNER" runner --jitconfig-file "$INSTANCE_DIR/jitconfig"
`

// ec2Fleet starts the whole system with one agent, host-a, whose backend is
// ec2 on f (the real SDK over HTTP, with the fake's credentials), serving
// pool linux with 3 slots; edit adjusts the backend's settings.
func ec2Fleet(t *testing.T, ctx context.Context, f *ec2sim.Server, edit func(*ec2.Settings), tune func(*config.Config)) (*harness.Fleet, harness.Options) {
	t.Helper()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": ec2sim.AccessKey, "AWS_SECRET_ACCESS_KEY": ec2sim.SecretKey,
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE":             filepath.Join(t.TempDir(), "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none"),
	} {
		t.Setenv(k, v)
	}
	o := demoOptions(t, 0)
	o.Tune = func(c *config.Config) {
		s := &ec2.Settings{Region: ec2sim.Region, Endpoint: f.URL(), AMI: "ami-berth-runner",
			InstanceTypes: []string{"m7i.large"}, Subnets: []string{"subnet-a"},
			UserData: simUserData, MaxAttempts: 6, MaxBackoff: 50 * time.Millisecond,
			Steps: backend.Steps{CreateTimeout: 20 * time.Second, StopTimeout: 15 * time.Second}}
		if edit != nil {
			edit(s)
		}
		a := c.Agents[0]
		a.Pools = map[string]config.Pool{"linux": {Labels: []string{"self-hosted", "linux", "x64"}, Slots: 3}}
		a.Backend = config.Backend{Kind: ec2.Kind, Settings: s}
		a.InventoryEvery, a.OrphanGrace = 300*time.Millisecond, time.Second
		a.ShutdownTimeout = 2 * time.Second // a failed test's cleanup does not wait 10 min for its VMs
		c.Agents = []config.Agent{a}
		c.Defaults()
		if tune != nil {
			tune(c)
		}
	}
	f.OnBoot(f.RunUserData(t.TempDir(), []string{"BERTH_SIM_RUNNER=" + filepath.Join(o.DataDir, "bin", "ghsim")}))
	fl, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fl.Stop() })
	return fl, o
}

// Given the whole system with one agent on the ec2 backend against a fake
// EC2 endpoint that the real aws-sdk-go-v2 talks to over HTTP, where the
// first instance type has no capacity (InsufficientInstanceCapacity), EC2
// throttles the first calls of every action (RequestLimitExceeded), and an
// instance of the fleet that no attempt owns is running; when 5 jobs
// arrive, then every job completes on a runner that an instance launched
// with the second type started from its user data, every instance ends
// terminated (the agent's teardown), the orphan is terminated by the sweep,
// every attempt is stopped, no slot is held and the log's invariants hold.
func TestEC2AgentServesJobsThroughPlacementTeardownSweepFallbackAndThrottling(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := ec2sim.New(t)
	f.Reject(func(form url.Values) string {
		if form.Get("InstanceType") == "m7i.large" {
			return "InsufficientInstanceCapacity"
		}
		return ""
	})
	for _, a := range []string{"RunInstances", "DescribeInstances", "TerminateInstances"} {
		f.Throttle(a, 2)
	}
	orphan := f.Seed("running", map[string]string{ec2.TagFleet: "host-a", ec2.TagAttempt: "berth-999-1", ec2.TagPool: "linux"})
	fl, _ := ec2Fleet(t, ctx, f, func(s *ec2.Settings) {
		s.InstanceTypes = []string{"m7i.large", "c7i.large"}
	}, nil)

	var jobs []int64
	for range 5 {
		jobs = append(jobs, fl.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 200 * time.Millisecond}))
	}
	waitUntil(t, ctx, "every job completed", jobsDone(fl, jobs...))
	state := func(id string) string {
		for _, i := range f.Instances() {
			if i.ID == id {
				return i.State
			}
		}
		return "gone"
	}
	waitUntil(t, ctx, "the orphan instance terminated by the sweep", func() (bool, string) {
		s := state(orphan)
		return s == "shutting-down" || s == "terminated", s
	})
	closeNC, js, err := run.JetStream(fl.Sys.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNC()
	waitUntil(t, ctx, "every attempt stopped and no slot held", func() (bool, string) {
		fleet, err := eventlog.Replay(ctx, js, nil)
		if err != nil {
			return false, err.Error()
		}
		for id, a := range fleet.Attempts {
			if !a.Stopped || a.Held() {
				return false, fmt.Sprintf("attempt %s: stopped %v, held %v", id, a.Stopped, a.Held())
			}
		}
		return len(fleet.Attempts) >= len(jobs), fmt.Sprintf("%d attempts", len(fleet.Attempts))
	})
	fleet, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if vs := fleet.Check(); len(vs) > 0 {
		t.Fatalf("invariants broken: %v", vs)
	}

	byAttempt := map[string]ec2sim.Instance{}
	for _, i := range f.Instances() {
		if i.ID == orphan {
			continue
		}
		byAttempt[i.Tags[ec2.TagAttempt]] = i
		if i.Type != "c7i.large" || (i.State != "shutting-down" && i.State != "terminated") {
			t.Errorf("instance %s of %s: %s, %s; want c7i.large (the fallback), terminated", i.ID, i.Tags[ec2.TagAttempt], i.Type, i.State)
		}
	}
	for _, id := range jobs {
		r := fleet.Jobs[id].Runner
		if _, ok := byAttempt[r]; !ok || !strings.HasPrefix(r, "berth-") {
			t.Errorf("job %d ran on %q, not on a runner an instance started", id, r)
		}
	}
	if n := f.Count("TerminateInstances"); n < len(jobs)+1 {
		t.Errorf("%d TerminateInstances calls for %d attempts and an orphan", n, len(jobs))
	}
	throttled := 0
	for _, a := range []string{"RunInstances", "DescribeInstances", "TerminateInstances"} {
		throttled += f.Count(a)
	}
	t.Logf("%d instances, %d EC2 calls (6 of them throttled and retried)", len(byAttempt), throttled)
}

// jobsDone holds when every job in ids is completed on the simulator.
func jobsDone(f *harness.Fleet, ids ...int64) func() (bool, string) {
	return func() (bool, string) {
		open := 0
		for _, j := range f.Sim.Jobs() {
			for _, id := range ids {
				if j.ID == id && j.Status != ghsim.StatusCompleted {
					open++
				}
			}
		}
		return open == 0, fmt.Sprintf("%d of %d jobs open", open, len(ids))
	}
}

// Given the whole system with one ec2 agent whose pool linux (2 CPU) has a
// shape xl (berth-size-xl: 8 CPU, its own AMI and instance types) on a host
// of 12 CPUs, when a job asks for xl, another for no shape and a third for
// an unknown shape xxl, then the xl job runs on an instance launched with
// the shape's AMI and first instance type, the plain job runs too, and the
// xxl job is unschedulable with a reason naming its label and the shape on
// offer, with no instance launched for it.
func TestEC2JobsChooseTheirMachineByLabel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := ec2sim.New(t)
	fl, _ := ec2Fleet(t, ctx, f, nil, func(c *config.Config) {
		a := &c.Agents[0]
		a.Resources = config.Resources{CPU: 12}
		a.Pools = map[string]config.Pool{"linux": {Labels: []string{"self-hosted", "linux", "x64"}, Slots: 3,
			Machine: config.Machine{CPU: 2},
			Shapes: map[string]config.Shape{"xl": {Labels: []string{"berth-size-xl"}, Slots: 1,
				Machine: config.Machine{CPU: 8, Image: "ami-xl", InstanceTypes: []string{"c7i.4xlarge", "m7i.4xlarge"}}}}}}
		a.PhysicalCap = 0
		c.Defaults()
	})
	xl := fl.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux", "berth-size-xl"}, Duration: 200 * time.Millisecond})
	plain := fl.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 200 * time.Millisecond})
	xxl := fl.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux", "berth-size-xxl"}, Duration: 200 * time.Millisecond})
	waitUntil(t, ctx, "the xl and the plain job completed", jobsDone(fl, xl, plain))

	closeNC, js, err := run.JetStream(fl.Sys.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNC()
	var reason string
	waitUntil(t, ctx, "the xxl job unschedulable", func() (bool, string) {
		fleet, err := eventlog.Replay(ctx, js, nil)
		if err != nil {
			return false, err.Error()
		}
		j := fleet.Jobs[xxl]
		if j == nil {
			return false, "not folded"
		}
		reason = j.UnschedulableReason
		return j.Unschedulable, fmt.Sprintf("%+v", j)
	})
	if !strings.Contains(reason, "berth-size-xxl") || !strings.Contains(reason, "berth-size-xl") {
		t.Errorf("reason %q does not name the label asked for and the shape on offer", reason)
	}
	fleet, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	byAttempt := map[string]ec2sim.Instance{}
	for _, i := range f.Instances() {
		byAttempt[i.Tags[ec2.TagAttempt]] = i
	}
	if i := byAttempt[fleet.Jobs[xl].Runner]; i.Type != "c7i.4xlarge" || i.Image != "ami-xl" || i.Tags[ec2.TagPool] != "linux-xl" {
		t.Errorf("the xl job ran on %q: instance %+v, want c7i.4xlarge from ami-xl in pool linux-xl", fleet.Jobs[xl].Runner, i)
	}
	if r := fleet.Jobs[plain].Runner; byAttempt[r].ID == "" {
		t.Errorf("the plain job ran on %q, no instance of ours", r)
	}
	for id, a := range fleet.Attempts {
		if a.JobID == xxl {
			t.Errorf("attempt %s booked for the xxl job", id)
		}
	}
	if vs := fleet.Check(); len(vs) > 0 {
		t.Fatalf("invariants broken: %v", vs)
	}
}

// Given the ec2 agent where no instance type has capacity, when a job
// arrives, then its placements fail charged to the backend (the agent's
// attempt.failed names culprit backend), none counts against the job, which
// stays demand; when capacity comes back, then the job is served.
func TestEC2CapacityIsChargedToTheBackendNotTheJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := ec2sim.New(t)
	f.Reject(func(url.Values) string { return "InsufficientInstanceCapacity" })
	fl, _ := ec2Fleet(t, ctx, f, func(s *ec2.Settings) { s.InstanceTypes = []string{"m7i.large", "c7i.large"} },
		func(c *config.Config) { c.Dispatcher.ProbeAfter = time.Second })
	job := fl.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 200 * time.Millisecond})

	closeNC, js, err := run.JetStream(fl.Sys.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNC()
	waitUntil(t, ctx, "two placements failed for capacity", func() (bool, string) {
		fleet, err := eventlog.Replay(ctx, js, nil)
		if err != nil {
			return false, err.Error()
		}
		failed := 0
		for _, a := range fleet.Attempts {
			if a.JobID == job && a.Failed {
				if a.FailedCulprit != events.CulpritBackend || !strings.Contains(a.FailedError, "InsufficientInstanceCapacity") {
					t.Fatalf("attempt %s failed charged to %q: %s", a.ID, a.FailedCulprit, a.FailedError)
				}
				failed++
			}
		}
		j := fleet.Jobs[job]
		if j != nil && (j.FailedAttempts != 0 || j.Unschedulable) {
			t.Fatalf("capacity counted against the job: %+v", j)
		}
		return failed >= 2, fmt.Sprintf("%d failed", failed)
	})
	f.Reject(nil) // capacity is back
	waitUntil(t, ctx, "the job served once capacity came back", jobsDone(fl, job))
}

// warmSimUserData is simUserData for warm instances: a first boot without a
// JIT config powers off at once (the instance stops); a boot after assign
// starts the runner.
const warmSimUserData = `#!/bin/sh
# Berth attempt {{.Attempt}} (pool {{.Pool}}, fleet {{.Fleet}}, warm {{.Warm}})
set -eu
{{if not .JITConfig}}exit 0{{end}}
printf '%s\n' '{{.JITConfig}}' >"$INSTANCE_DIR/jitconfig"
exec "$BERTH_SIM_RUNNER" runner --jitconfig-file "$INSTANCE_DIR/jitconfig"
`

// Given the whole system with one ec2 agent with assign_by_restart and a
// warm pool (linux, min_idle 1), when the pool has filled (an instance
// booted once and stopped) and a job arrives, then the job runs on the warm
// VM, which was created before the job was queued and started again with
// the job's JIT config in its user data (no launch in the job's path), and
// the pool refills.
func TestEC2WarmInstancesServeJobsByRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := ec2sim.New(t)
	fl, _ := ec2Fleet(t, ctx, f, func(s *ec2.Settings) {
		s.AssignByRestart, s.StatePollEvery, s.UserData = true, 50*time.Millisecond, warmSimUserData
	}, func(c *config.Config) {
		c.Dispatcher.WarmPools = map[string]config.WarmPool{"linux": {MinIdle: 1}}
	})
	idle := func(n int) func() (bool, string) {
		return func() (bool, string) {
			p, err := poolStatus(ctx, fl.Sys, "linux")
			return err == nil && p.WarmIdle == n && p.WarmWarming == 0, fmt.Sprintf("%+v %v", p, err)
		}
	}
	waitUntil(t, ctx, "1 idle warm instance", idle(1))
	launches := f.Count("RunInstances")
	if all := f.Instances(); len(all) != 1 || all[0].State != "stopped" {
		t.Fatalf("instances %+v, want one stopped warm instance", all)
	}

	job := fl.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 200 * time.Millisecond})
	waitUntil(t, ctx, "the job completed", jobsDone(fl, job))
	closeNC, js, err := run.JetStream(fl.Sys.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNC()
	fleet, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	runner := fleet.Jobs[job].Runner
	a := fleet.Attempts[runner]
	if a == nil || !a.Warm || !a.Assigned || !a.ProvisioningAt.Before(fleet.Jobs[job].QueuedAt) {
		t.Fatalf("job ran on %q (%+v): want a warm VM created before the job was queued", runner, a)
	}
	var inst ec2sim.Instance
	for _, i := range f.Instances() {
		if i.Tags[ec2.TagAttempt] == runner {
			inst = i
		}
	}
	if ud, _ := inst.Script(); inst.ID == "" || !strings.Contains(ud, "warm true") || f.Count("StartInstances") < 1 {
		t.Fatalf("the job's instance %+v (%d starts): want the warm instance restarted with its new user data", inst, f.Count("StartInstances"))
	}
	waitUntil(t, ctx, "the pool refilled", idle(1))
	if f.Count("RunInstances") <= launches {
		t.Error("the pool refilled without a launch")
	}
}
