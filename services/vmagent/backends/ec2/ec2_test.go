package ec2_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.uber.org/goleak"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/ec2"
	"github.com/berth-ci/berth/services/vmagent/backends/ec2/ec2sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const jit = "eyJqaXQiOiJjb25maWcifQ=="

// newBackend returns a backend that talks to f over HTTP with static
// credentials, with fast SDK retries; edit adjusts the options.
func newBackend(t *testing.T, f *ec2sim.Server, edit func(*ec2.Options)) *ec2.Backend {
	t.Helper()
	o := ec2.Options{
		Region: "us-east-1", Endpoint: f.URL(), Fleet: "fleet-a",
		LaunchTemplateName: "berth-runner", LaunchTemplateVersion: "3",
		InstanceTypes: []string{"m7i.large"}, Subnets: []string{"subnet-a"},
		Credentials: credentials.NewStaticCredentialsProvider("AKIDFAKE", "secret", ""),
		MaxAttempts: 3, MaxBackoff: 5 * time.Millisecond,
	}
	if edit != nil {
		edit(&o)
	}
	b, err := ec2.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// vm is an attempt's VM with its JIT config file, as the agent prepares it.
func vm(t *testing.T, attempt string) backend.VM {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "jitconfig")
	if err := os.WriteFile(p, []byte(jit+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return backend.VM{Attempt: attempt, Pool: "linux", Host: "aws-1", Labels: []string{"self-hosted", "linux", "x64"}, JobID: 42,
		JITConfigFile: p, WorkDir: dir}
}

// bounded is a context that ends well before the test would hang.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCreateLaunchesOneInstanceTaggedInTheCallWithTheAttemptsToken(t *testing.T) {
	// Given a backend with a launch template, a type, a subnet and extra tags.
	f := ec2sim.New(t)
	b := newBackend(t, f, func(o *ec2.Options) { o.Tags = map[string]string{"team": "ci"} })

	// When an attempt is created.
	if err := b.Create(bounded(t), vm(t, "berth-42-1")); err != nil {
		t.Fatal(err)
	}

	// Then one RunInstances call launched one instance with the attempt's
	// token, the template, and the tags on the instance and its volumes.
	runs := f.RunForms()
	if len(runs) != 1 {
		t.Fatalf("%d RunInstances calls, want 1", len(runs))
	}
	r := runs[0]
	wantToken := ec2.ClientToken("berth-42-1", "fleet-a", false, "m7i.large", "subnet-a")
	for k, want := range map[string]string{
		"ClientToken": wantToken, "MinCount": "1", "MaxCount": "1",
		"LaunchTemplate.LaunchTemplateName": "berth-runner", "LaunchTemplate.Version": "3",
		"InstanceType": "m7i.large", "SubnetId": "subnet-a", "InstanceInitiatedShutdownBehavior": "terminate",
	} {
		if got := r.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if !strings.HasPrefix(wantToken, "berth-42-1-") || len(wantToken) > 64 {
		t.Errorf("token %q: want the attempt id and a short suffix, at most 64 characters", wantToken)
	}
	specs := tagSpecsOf(r)
	wantTags := map[string]string{"berth:attempt": "berth-42-1", "berth:pool": "linux", "berth:fleet": "fleet-a", "Name": "berth-42-1", "team": "ci"}
	for _, res := range []string{"instance", "volume"} {
		for k, v := range wantTags {
			if specs[res][k] != v {
				t.Errorf("%s tag %s = %q, want %q (tags: %v)", res, k, specs[res][k], v, specs[res])
			}
		}
	}
	ud, err := ec2sim.Instance{UserData: r.Get("UserData")}.Script()
	if err != nil {
		t.Fatalf("user data is not base64: %v", err)
	}
	if !strings.Contains(ud, "\n"+jit+"\n") || !strings.Contains(ud, "berth-42-1") || !strings.HasPrefix(ud, "#!/bin/bash") {
		t.Errorf("user data does not carry the JIT config and attempt:\n%s", ud)
	}
	if n := len(f.Instances()); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
	if f.Instances()[0].Tags["berth:attempt"] != "berth-42-1" {
		t.Errorf("the instance is not tagged: %v", f.Instances()[0].Tags)
	}
}

func tagSpecsOf(r url.Values) map[string]map[string]string { return ec2sim.TagSpecs(r) }

func TestARetriedCreateMakesOneInstance(t *testing.T) {
	t.Run("the SDK retries a launch whose reply was lost, with the same token", func(t *testing.T) {
		// Given EC2 launches but its reply is lost (500 InternalError).
		f := ec2sim.New(t)
		f.LoseReplies(1)
		b := newBackend(t, f, nil)

		// When an attempt is created.
		if err := b.Create(bounded(t), vm(t, "berth-7-1")); err != nil {
			t.Fatal(err)
		}

		// Then the retried call carried the same token and got the same
		// instance: two calls, one instance.
		runs := f.RunForms()
		if len(runs) != 2 || runs[0].Get("ClientToken") != runs[1].Get("ClientToken") {
			t.Fatalf("want 2 calls with one token, got %d: %v", len(runs), tokens(runs))
		}
		if n := len(f.Instances()); n != 1 {
			t.Errorf("%d instances, want 1", n)
		}
	})
	t.Run("create run again before EC2 shows the instance", func(t *testing.T) {
		// Given an attempt created while EC2's reads lag behind its launches.
		f := ec2sim.New(t)
		f.Hide()
		b := newBackend(t, f, nil)
		v := vm(t, "berth-7-2")
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}

		// When the create runs again (the lookup finds nothing yet).
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}

		// Then the second launch reused the token and EC2 returned the
		// first instance.
		if runs := f.RunForms(); len(runs) != 2 || runs[0].Get("ClientToken") != runs[1].Get("ClientToken") {
			t.Fatalf("want 2 calls with one token, got %v", tokens(runs))
		}
		if n := len(f.Instances()); n != 1 {
			t.Errorf("%d instances, want 1", n)
		}
	})
	t.Run("a restarted agent adopts the attempt's instance", func(t *testing.T) {
		// Given an attempt's instance launched by an agent since restarted.
		f := ec2sim.New(t)
		v := vm(t, "berth-7-3")
		if err := newBackend(t, f, nil).Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}

		// When the new agent creates the attempt, with other types.
		b := newBackend(t, f, func(o *ec2.Options) { o.InstanceTypes = []string{"c7i.large"} })
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}

		// Then it found the instance by tag and launched nothing.
		if runs := f.RunForms(); len(runs) != 1 {
			t.Errorf("%d RunInstances calls, want 1", len(runs))
		}
	})
}

func tokens(runs []url.Values) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.Get("ClientToken"))
	}
	return out
}

func TestCapacityFallsBackAcrossTypesAndSubnets(t *testing.T) {
	// Given two types and two subnets, where only c7i.large in subnet-b has
	// capacity (EC2 answers InsufficientInstanceCapacity with HTTP 500).
	f := ec2sim.New(t)
	f.Reject(func(r url.Values) string {
		if r.Get("InstanceType") == "c7i.large" && r.Get("SubnetId") == "subnet-b" {
			return ""
		}
		return "InsufficientInstanceCapacity"
	})
	b := newBackend(t, f, func(o *ec2.Options) {
		o.InstanceTypes = []string{"m7i.large", "c7i.large"}
		o.Subnets = []string{"subnet-a", "subnet-b"}
	})

	// When an attempt is created.
	if err := b.Create(bounded(t), vm(t, "berth-9-1")); err != nil {
		t.Fatal(err)
	}

	// Then the combinations were tried in order, each once (capacity errors
	// are not retried in place), each with its own token, and the instance
	// runs in the one with capacity.
	var tried []string
	seen := map[string]bool{}
	for _, r := range f.RunForms() {
		tried = append(tried, r.Get("InstanceType")+"/"+r.Get("SubnetId"))
		if seen[r.Get("ClientToken")] {
			t.Errorf("token %s reused across combinations", r.Get("ClientToken"))
		}
		seen[r.Get("ClientToken")] = true
	}
	want := []string{"m7i.large/subnet-a", "m7i.large/subnet-b", "c7i.large/subnet-a", "c7i.large/subnet-b"}
	if !slices.Equal(tried, want) {
		t.Errorf("tried %v, want %v", tried, want)
	}
	if all := f.Instances(); len(all) != 1 || all[0].Type != "c7i.large" || all[0].AZ != "us-east-1b" {
		t.Errorf("instances: %+v", all)
	}
}

func TestCapacityExhaustedEverywhereFailsWithErrNoCapacity(t *testing.T) {
	// Given no capacity anywhere, and an instance limit on the first type.
	f := ec2sim.New(t)
	f.Reject(func(r url.Values) string {
		if r.Get("InstanceType") == "m7i.large" {
			return "VcpuLimitExceeded"
		}
		return "InsufficientInstanceCapacity"
	})
	b := newBackend(t, f, func(o *ec2.Options) {
		o.InstanceTypes = []string{"m7i.large", "c7i.large"}
		o.Subnets = []string{"subnet-a", "subnet-b"}
	})

	// When an attempt is created.
	err := b.Create(bounded(t), vm(t, "berth-9-2"))

	// Then it fails with ErrNoCapacity naming what was tried; the limited
	// type was not tried in its other subnet (limits are regional).
	if !errors.Is(err, ec2.ErrNoCapacity) || !strings.Contains(err.Error(), "c7i.large in subnet-b: InsufficientInstanceCapacity") {
		t.Fatalf("got %v", err)
	}
	if n := len(f.RunForms()); n != 3 {
		t.Errorf("%d RunInstances calls, want 3 (m7i once, c7i in both subnets)", n)
	}
	if n := len(f.Instances()); n != 0 {
		t.Errorf("%d instances, want none", n)
	}
	// And capacity is charged to the backend, not to the host or the job.
	if c := backend.Culprit(err); c != events.CulpritBackend {
		t.Errorf("no capacity is charged to %q, want %q", c, events.CulpritBackend)
	}
}

// Given EC2 refusing a launch for a reason that is no capacity, when an
// attempt is created, then the failure is charged where it belongs: an
// unknown AMI to the image, any other answer of EC2's to the backend, and a
// call that never got an answer (its deadline) to the host.
func TestCreateFailuresAreChargedToTheirCulprit(t *testing.T) {
	for _, tc := range []struct {
		code, culprit string
	}{
		{"InvalidAMIID.NotFound", events.CulpritImage},
		{"UnauthorizedOperation", events.CulpritBackend},
		{"RequestLimitExceeded", events.CulpritBackend}, // past the retry budget
		{"", events.CulpritHost},                        // the call hangs past its deadline
	} {
		t.Run(tc.culprit+"/"+tc.code, func(t *testing.T) {
			f := ec2sim.New(t)
			ctx := bounded(t)
			switch tc.code {
			case "":
				f.Hang("RunInstances")
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
			case "RequestLimitExceeded":
				f.Throttle("RunInstances", 100)
			default:
				f.Reject(func(url.Values) string { return tc.code })
			}
			b := newBackend(t, f, nil)
			err := b.Create(ctx, vm(t, "berth-9-3"))
			if err == nil {
				t.Fatal("create succeeded")
			}
			if c := backend.Culprit(err); c != tc.culprit {
				t.Errorf("%v is charged to %q, want %q", err, c, tc.culprit)
			}
		})
	}
}

func TestSpotFallsBackToOnDemand(t *testing.T) {
	// Given spot preferred, two types, and no spot capacity for the first
	// then a spot instance limit.
	f := ec2sim.New(t)
	f.Reject(func(r url.Values) string {
		switch {
		case r.Get("InstanceMarketOptions.MarketType") != "spot":
			return ""
		case r.Get("InstanceType") == "m7i.large":
			return "InsufficientInstanceCapacity"
		default:
			return "MaxSpotInstanceCountExceeded"
		}
	})
	b := newBackend(t, f, func(o *ec2.Options) {
		o.Spot, o.SpotMaxPrice = ec2.SpotPrefer, "0.20"
		o.InstanceTypes = []string{"m7i.large", "c7i.large", "r7i.large"}
	})

	// When an attempt is created.
	if err := b.Create(bounded(t), vm(t, "berth-11-1")); err != nil {
		t.Fatal(err)
	}

	// Then spot was tried (one-time, terminate on interruption, max price)
	// until the spot limit, then on-demand with the first type.
	var tried []string
	for _, r := range f.RunForms() {
		tried = append(tried, r.Get("InstanceMarketOptions.MarketType")+":"+r.Get("InstanceType"))
		if r.Get("InstanceMarketOptions.MarketType") == "spot" &&
			(r.Get("InstanceMarketOptions.SpotOptions.SpotInstanceType") != "one-time" || r.Get("InstanceMarketOptions.SpotOptions.MaxPrice") != "0.20") {
			t.Errorf("spot options: %v", r)
		}
	}
	if want := []string{"spot:m7i.large", "spot:c7i.large", ":m7i.large"}; !slices.Equal(tried, want) {
		t.Errorf("tried %v, want %v", tried, want)
	}
	if all := f.Instances(); len(all) != 1 || all[0].Spot {
		t.Errorf("want one on-demand instance, got %+v", all)
	}
}

func TestThrottledCallsAreRetriedBySDK(t *testing.T) {
	// Given EC2 throttles the first two calls of each action.
	f := ec2sim.New(t)
	for _, a := range []string{"RunInstances", "DescribeInstances", "TerminateInstances"} {
		f.Throttle(a, 2)
	}
	b := newBackend(t, f, func(o *ec2.Options) { o.MaxAttempts = 3 })
	v := vm(t, "berth-13-1")

	// When an attempt is created, listed and stopped.
	start := time.Now()
	if err := b.Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	ids, err := b.List(bounded(t))
	if err != nil || !slices.Equal(ids, []string{"berth-13-1"}) {
		t.Fatalf("list: %v, %v", ids, err)
	}
	if err := b.Stop(bounded(t), v); err != nil {
		t.Fatal(err)
	}

	// Then each succeeded on its third attempt, quickly with this backoff.
	if n := f.Count("RunInstances"); n != 3 {
		t.Errorf("%d RunInstances calls, want 3", n)
	}
	if n := f.Count("TerminateInstances"); n != 3 {
		t.Errorf("%d TerminateInstances calls, want 3", n)
	}
	if n := len(f.Instances()); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}

	// And past MaxAttempts the throttling error is returned.
	f.Throttle("DescribeInstances", 3)
	if _, err := b.List(bounded(t)); err == nil || !strings.Contains(err.Error(), "RequestLimitExceeded") {
		t.Errorf("want RequestLimitExceeded after 3 attempts, got %v", err)
	}
}

func TestStopTerminatesTheAttemptsInstance(t *testing.T) {
	// Given two attempts' instances.
	f := ec2sim.New(t)
	b := newBackend(t, f, nil)
	a, other := vm(t, "berth-15-1"), vm(t, "berth-15-2")
	for _, v := range []backend.VM{a, other} {
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}
	}

	// When one is stopped, by this agent and by a restarted one (which
	// finds the instance by tag).
	if err := b.Stop(bounded(t), a); err != nil {
		t.Fatal(err)
	}
	if err := newBackend(t, f, nil).Stop(bounded(t), a); err != nil {
		t.Fatal(err)
	}

	// Then its instance is shutting down or terminated and the other runs.
	for _, i := range f.Instances() {
		stopped := i.State == "shutting-down" || i.State == "terminated"
		if stopped != (i.Tags["berth:attempt"] == "berth-15-1") {
			t.Errorf("%s of %s is %s", i.ID, i.Tags["berth:attempt"], i.State)
		}
	}
	if n := f.Count("TerminateInstances"); n != 1 {
		t.Errorf("%d TerminateInstances calls, want 1 (a shutting-down instance is already stopped)", n)
	}
}

func TestStopCountsAVanishedOrTerminatedInstanceAsStopped(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f := ec2sim.New(t)
	b := newBackend(t, f, func(o *ec2.Options) { o.Now = c.Now; o.NotFoundGrace = time.Minute })

	t.Run("gone from EC2", func(t *testing.T) {
		// Given an attempt whose instance EC2 no longer knows.
		v := vm(t, "berth-17-1")
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}
		f.Vanish(f.Instances()[0].ID)

		// When it is stopped right after launch, EC2 may just be lagging:
		// the stop fails and will be tried again.
		if err := b.Stop(bounded(t), v); err == nil || !strings.Contains(err.Error(), "InvalidInstanceID.NotFound") {
			t.Fatalf("within the grace: got %v", err)
		}

		// When it is stopped later, InvalidInstanceID.NotFound means gone.
		c.Advance(2 * time.Minute)
		if err := b.Stop(bounded(t), v); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("already terminated", func(t *testing.T) {
		v := vm(t, "berth-17-2")
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}
		all := f.Instances()
		f.SetState(all[len(all)-1].ID, "terminated")
		if err := b.Stop(bounded(t), v); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("never launched", func(t *testing.T) {
		before := f.Count("TerminateInstances")
		if err := b.Stop(bounded(t), vm(t, "berth-17-3")); err != nil {
			t.Fatal(err)
		}
		if f.Count("TerminateInstances") != before {
			t.Error("terminated something for an attempt that has no instance")
		}
	})
}

func TestListReadsTheFleetsLiveInstancesByTag(t *testing.T) {
	// Given this fleet's instances in every state, another fleet's, and an
	// untagged one, over several pages.
	f := ec2sim.New(t)
	tag := func(fleet, attempt string) map[string]string {
		return map[string]string{"berth:fleet": fleet, "berth:attempt": attempt}
	}
	var want []string
	for n, state := range []string{"pending", "running", "running", "stopping", "stopped", "running", "running", "running"} {
		a := "berth-20-" + string(rune('a'+n))
		f.Seed(state, tag("fleet-a", a))
		want = append(want, a)
	}
	f.Seed("shutting-down", tag("fleet-a", "berth-21-1"))
	f.Seed("terminated", tag("fleet-a", "berth-21-2"))
	f.Seed("running", tag("fleet-b", "berth-21-3"))
	f.Seed("running", nil)
	b := newBackend(t, f, func(o *ec2.Options) { o.PageSize = 5 })

	// When the inventory is read.
	got, err := b.List(bounded(t))

	// Then it holds exactly this fleet's live attempts, read page by page.
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if n := f.Count("DescribeInstances"); n != 2 {
		t.Errorf("%d DescribeInstances pages, want 2", n)
	}
}

func TestCallsEndWithTheirDeadline(t *testing.T) {
	for _, action := range []string{"RunInstances", "TerminateInstances", "DescribeInstances"} {
		t.Run(action, func(t *testing.T) {
			// Given EC2 never answers the action.
			f := ec2sim.New(t)
			b := newBackend(t, f, nil)
			v := vm(t, "berth-23-1")
			if action == "TerminateInstances" {
				if err := b.Create(bounded(t), v); err != nil {
					t.Fatal(err)
				}
			}
			f.Hang(action)

			// When the call is made with a short deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			var err error
			switch action {
			case "RunInstances":
				err = b.Create(ctx, v)
			case "TerminateInstances":
				err = b.Stop(ctx, v)
			default:
				_, err = b.List(ctx)
			}

			// Then it returns promptly with the deadline's error.
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("got %v, want a deadline error", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("returned after %v", d)
			}
		})
	}
}

func TestClientTokensAreDeterministicAndDistinct(t *testing.T) {
	a := ec2.ClientToken("berth-1-1", "f", false, "m7i.large", "subnet-a")
	if a != ec2.ClientToken("berth-1-1", "f", false, "m7i.large", "subnet-a") {
		t.Error("not deterministic")
	}
	for _, other := range []string{
		ec2.ClientToken("berth-1-2", "f", false, "m7i.large", "subnet-a"),
		ec2.ClientToken("berth-1-1", "g", false, "m7i.large", "subnet-a"),
		ec2.ClientToken("berth-1-1", "f", true, "m7i.large", "subnet-a"),
		ec2.ClientToken("berth-1-1", "f", false, "c7i.large", "subnet-a"),
		ec2.ClientToken("berth-1-1", "f", false, "m7i.large", "subnet-b"),
	} {
		if other == a {
			t.Errorf("%s collides", other)
		}
	}
	if long := ec2.ClientToken(strings.Repeat("x", 100), "f", false, "", ""); len(long) > 64 {
		t.Errorf("token of %d characters", len(long))
	}
}

func TestBadUserDataIsRefused(t *testing.T) {
	f := ec2sim.New(t)
	// A template naming a field that does not exist fails at New.
	_, err := ec2.New(context.Background(), ec2.Options{Region: "us-east-1", Fleet: "f", AMI: "ami-1", UserData: "{{.Token}}"})
	if err == nil || !strings.Contains(err.Error(), "Token") {
		t.Errorf("got %v", err)
	}
	// A JIT config that is not base64 text is not pasted into a script.
	b := newBackend(t, f, nil)
	v := vm(t, "berth-25-1")
	if err := os.WriteFile(v.JITConfigFile, []byte("x'\n$(reboot)"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.Create(bounded(t), v); err == nil || !strings.Contains(err.Error(), "base64") {
		t.Errorf("got %v", err)
	}
	// User data over EC2's 16 KiB is refused before any call.
	big := newBackend(t, f, func(o *ec2.Options) { o.UserData = strings.Repeat("#", ec2.MaxUserData) + "{{.JITConfig}}" })
	if err := big.Create(bounded(t), vm(t, "berth-25-2")); err == nil || !strings.Contains(err.Error(), "16384") {
		t.Errorf("got %v", err)
	}
	if n := f.Count("RunInstances"); n != 0 {
		t.Errorf("%d RunInstances calls, want 0", n)
	}
}

func TestAReusedTokenWithOtherParametersAdoptsTheAttemptsInstance(t *testing.T) {
	// Given an attempt launched, then the configuration changed (other
	// tags: the same token now comes with other parameters), while EC2's
	// reads still lag.
	f := ec2sim.New(t)
	f.Hide()
	v := vm(t, "berth-27-1")
	if err := newBackend(t, f, nil).Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, f, func(o *ec2.Options) { o.Tags = map[string]string{"team": "new"} })

	// When the attempt is created again, EC2 answers
	// IdempotentParameterMismatch: with nothing found by tag it is an error …
	if err := b.Create(bounded(t), v); err == nil || !strings.Contains(err.Error(), "IdempotentParameterMismatch") {
		t.Fatalf("got %v", err)
	}
	// … and once EC2 shows the instance, it is adopted.
	f.Reveal()
	if err := b.Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Instances()); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
}

// Given a backend with its own AMI and instance types, when an attempt of a
// pool whose machine shape names an AMI and instance types is created, then
// the launch uses the shape's AMI and tries the shape's types in order
// (capacity falls back within them), never the backend's defaults.
func TestCreateLaunchesTheAttemptsMachineShape(t *testing.T) {
	f := ec2sim.New(t)
	f.Reject(func(r url.Values) string {
		if r.Get("InstanceType") == "c7i.4xlarge" {
			return "InsufficientInstanceCapacity"
		}
		return ""
	})
	b := newBackend(t, f, func(o *ec2.Options) { o.AMI = "ami-default" })
	v := vm(t, "berth-77-1")
	v.Shape = &events.Shape{CPU: 16, Image: "ami-xcode-16", InstanceTypes: []string{"c7i.4xlarge", "m7i.4xlarge"}}
	if err := b.Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	var tried []string
	for _, r := range f.RunForms() {
		tried = append(tried, r.Get("InstanceType")+"/"+r.Get("ImageId"))
	}
	if want := []string{"c7i.4xlarge/ami-xcode-16", "m7i.4xlarge/ami-xcode-16"}; !slices.Equal(tried, want) {
		t.Fatalf("launches tried %v, want %v", tried, want)
	}
}

// warmUserData boots as the fake's instances do (ec2sim.RunUserData): a
// warm first boot powers off at once; an assigned boot records its JIT
// config and keeps running like a runner would.
const warmUserData = `#!/bin/sh
{{if .JITConfig}}printf '%s' '{{.JITConfig}}' >"$INSTANCE_DIR/assigned"
exec sleep 60{{end}}
`

// Given a backend with assign_by_restart on the fake EC2 endpoint, when a
// warm VM is created, then it is launched to stop on power-off with user
// data holding no JIT config, and Create returns once the instance has
// booted and stopped; when a job's JIT config is assigned, then it is
// written into the instance's user data and the instance starts again and
// boots with it; Stop terminates it.
func TestWarmInstancesAreAssignedByRestartingThemWithTheJITConfig(t *testing.T) {
	f := ec2sim.New(t)
	boots := t.TempDir()
	f.OnBoot(f.RunUserData(boots, nil))
	b := newBackend(t, f, func(o *ec2.Options) {
		o.AssignByRestart, o.PollEvery, o.UserData = true, 10*time.Millisecond, warmUserData
	})
	if !b.CanAssign() {
		t.Fatal("with assign_by_restart the backend says it cannot keep warm VMs")
	}
	v := vm(t, "berth-warm-linux-1")
	jitFile := v.JITConfigFile
	v.Warm, v.JITConfigFile = true, ""
	if err := b.Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	inst := f.Instances()[0]
	ud, _ := inst.Script()
	if inst.State != "stopped" || f.RunForms()[0].Get("InstanceInitiatedShutdownBehavior") != "stop" || strings.Contains(ud, jit) {
		t.Fatalf("after a warm create: state %s, shutdown behaviour %q, user data %q; want stopped, stop, no JIT config",
			inst.State, f.RunForms()[0].Get("InstanceInitiatedShutdownBehavior"), ud)
	}

	v.JITConfigFile = jitFile
	if err := b.Assign(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	if ud, _ := f.Instances()[0].Script(); !strings.Contains(ud, jit) || f.Count("StartInstances") != 1 {
		t.Fatalf("after assign: %d starts, user data %q; want one start and the JIT config", f.Count("StartInstances"), ud)
	}
	testkit.Poll(t, bounded(t), 10*time.Second, 10*time.Millisecond, "the restarted instance boots with the JIT config", func(context.Context) error {
		b, err := os.ReadFile(filepath.Join(boots, inst.ID, "assigned"))
		if err != nil || string(b) != jit {
			return fmt.Errorf("assigned: %q %v", b, err)
		}
		return nil
	})
	if err := b.Stop(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	if s := f.Instances()[0].State; s != "shutting-down" {
		t.Fatalf("after stop: %s", s)
	}
}

// Given a backend without assign_by_restart, it keeps no warm VMs: it says
// so, and a warm create or an assign is refused with backend.ErrNoAssign.
func TestWithoutAssignByRestartThereAreNoWarmInstances(t *testing.T) {
	f := ec2sim.New(t)
	b := newBackend(t, f, nil)
	v := vm(t, "berth-warm-linux-2")
	if b.CanAssign() || !errors.Is(b.Assign(bounded(t), v), backend.ErrNoAssign) {
		t.Fatal("without assign_by_restart the backend must say it cannot assign")
	}
	v.Warm = true
	if err := b.Create(bounded(t), v); !errors.Is(err, backend.ErrNoAssign) || f.Count("RunInstances") != 0 {
		t.Fatalf("a warm create without assign_by_restart: %v, %d launches", err, f.Count("RunInstances"))
	}
}

// The agent hands ec2 the JIT config in memory (backend.InMemoryJIT).
var _ backend.InMemoryJIT = (*ec2.Backend)(nil)

// Given the JIT config in memory, as the agent hands it to ec2, when an
// attempt is created, then its user data carries it exactly as from a
// file; and a config in memory that is not base64 text is refused before
// any call, as from a file.
func TestTheJITConfigInMemoryMakesTheSameUserData(t *testing.T) {
	f := ec2sim.New(t)
	b := newBackend(t, f, nil)
	v := vm(t, "berth-43-1")
	v.JITConfigFile, v.WorkDir, v.JITConfig = "", "", []byte(jit)
	if err := b.Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	if err := b.Create(bounded(t), vm(t, "berth-44-1")); err != nil {
		t.Fatal(err)
	}
	runs := f.RunForms()
	if len(runs) != 2 {
		t.Fatalf("%d RunInstances calls, want 2", len(runs))
	}
	mem, err := ec2sim.Instance{UserData: runs[0].Get("UserData")}.Script()
	if err != nil {
		t.Fatal(err)
	}
	file, err := ec2sim.Instance{UserData: runs[1].Get("UserData")}.Script()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mem, "\n"+jit+"\n") || strings.ReplaceAll(mem, "berth-43-1", "berth-44-1") != file {
		t.Errorf("user data from memory:\n%s\nfrom a file:\n%s", mem, file)
	}
	bad := v
	bad.Attempt, bad.JITConfig = "berth-45-1", []byte("x'\n$(reboot)")
	if err := b.Create(bounded(t), bad); err == nil || !strings.Contains(err.Error(), "base64") {
		t.Errorf("a JIT config in memory that is not base64: got %v", err)
	}
	if n := f.Count("RunInstances"); n != 2 {
		t.Errorf("%d RunInstances calls, want 2", n)
	}
}
