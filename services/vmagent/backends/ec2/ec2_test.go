package ec2_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.uber.org/goleak"

	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/ec2"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const jit = "eyJqaXQiOiJjb25maWcifQ=="

// newBackend returns a backend that talks to f over HTTP with static
// credentials, with fast SDK retries; edit adjusts the options.
func newBackend(t *testing.T, f *fakeEC2, edit func(*ec2.Options)) *ec2.Backend {
	t.Helper()
	o := ec2.Options{
		Region: "us-east-1", Endpoint: f.srv.URL, Fleet: "fleet-a",
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
	f := newFakeEC2(t)
	b := newBackend(t, f, func(o *ec2.Options) { o.Tags = map[string]string{"team": "ci"} })

	// When an attempt is created.
	if err := b.Create(bounded(t), vm(t, "berth-42-1")); err != nil {
		t.Fatal(err)
	}

	// Then one RunInstances call launched one instance with the attempt's
	// token, the template, and the tags on the instance and its volumes.
	runs := f.runForms()
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
	ud := decodeUserData(t, r.Get("UserData"))
	if !strings.Contains(ud, "\n"+jit+"\n") || !strings.Contains(ud, "berth-42-1") || !strings.HasPrefix(ud, "#!/bin/bash") {
		t.Errorf("user data does not carry the JIT config and attempt:\n%s", ud)
	}
	if n := len(f.all()); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
	if f.all()[0].tags["berth:attempt"] != "berth-42-1" {
		t.Errorf("the instance is not tagged: %v", f.all()[0].tags)
	}
}

func tagSpecsOf(r url.Values) map[string]map[string]string { return tagSpecs(r) }

func TestARetriedCreateMakesOneInstance(t *testing.T) {
	t.Run("the SDK retries a launch whose reply was lost, with the same token", func(t *testing.T) {
		// Given EC2 launches but its reply is lost (500 InternalError).
		f := newFakeEC2(t)
		f.loseReply = 1
		b := newBackend(t, f, nil)

		// When an attempt is created.
		if err := b.Create(bounded(t), vm(t, "berth-7-1")); err != nil {
			t.Fatal(err)
		}

		// Then the retried call carried the same token and got the same
		// instance: two calls, one instance.
		runs := f.runForms()
		if len(runs) != 2 || runs[0].Get("ClientToken") != runs[1].Get("ClientToken") {
			t.Fatalf("want 2 calls with one token, got %d: %v", len(runs), tokens(runs))
		}
		if n := len(f.all()); n != 1 {
			t.Errorf("%d instances, want 1", n)
		}
	})
	t.Run("create run again before EC2 shows the instance", func(t *testing.T) {
		// Given an attempt created while EC2's reads lag behind its launches.
		f := newFakeEC2(t)
		f.hidden = true
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
		if runs := f.runForms(); len(runs) != 2 || runs[0].Get("ClientToken") != runs[1].Get("ClientToken") {
			t.Fatalf("want 2 calls with one token, got %v", tokens(runs))
		}
		if n := len(f.all()); n != 1 {
			t.Errorf("%d instances, want 1", n)
		}
	})
	t.Run("a restarted agent adopts the attempt's instance", func(t *testing.T) {
		// Given an attempt's instance launched by an agent since restarted.
		f := newFakeEC2(t)
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
		if runs := f.runForms(); len(runs) != 1 {
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
	f := newFakeEC2(t)
	f.reject = func(r url.Values) string {
		if r.Get("InstanceType") == "c7i.large" && r.Get("SubnetId") == "subnet-b" {
			return ""
		}
		return "InsufficientInstanceCapacity"
	}
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
	for _, r := range f.runForms() {
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
	if all := f.all(); len(all) != 1 || all[0].itype != "c7i.large" || all[0].az != "us-east-1b" {
		t.Errorf("instances: %+v", all)
	}
}

func TestCapacityExhaustedEverywhereFailsWithErrNoCapacity(t *testing.T) {
	// Given no capacity anywhere, and an instance limit on the first type.
	f := newFakeEC2(t)
	f.reject = func(r url.Values) string {
		if r.Get("InstanceType") == "m7i.large" {
			return "VcpuLimitExceeded"
		}
		return "InsufficientInstanceCapacity"
	}
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
	if n := len(f.runForms()); n != 3 {
		t.Errorf("%d RunInstances calls, want 3 (m7i once, c7i in both subnets)", n)
	}
	if n := len(f.all()); n != 0 {
		t.Errorf("%d instances, want none", n)
	}
}

func TestSpotFallsBackToOnDemand(t *testing.T) {
	// Given spot preferred, two types, and no spot capacity for the first
	// then a spot instance limit.
	f := newFakeEC2(t)
	f.reject = func(r url.Values) string {
		switch {
		case r.Get("InstanceMarketOptions.MarketType") != "spot":
			return ""
		case r.Get("InstanceType") == "m7i.large":
			return "InsufficientInstanceCapacity"
		default:
			return "MaxSpotInstanceCountExceeded"
		}
	}
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
	for _, r := range f.runForms() {
		tried = append(tried, r.Get("InstanceMarketOptions.MarketType")+":"+r.Get("InstanceType"))
		if r.Get("InstanceMarketOptions.MarketType") == "spot" &&
			(r.Get("InstanceMarketOptions.SpotOptions.SpotInstanceType") != "one-time" || r.Get("InstanceMarketOptions.SpotOptions.MaxPrice") != "0.20") {
			t.Errorf("spot options: %v", r)
		}
	}
	if want := []string{"spot:m7i.large", "spot:c7i.large", ":m7i.large"}; !slices.Equal(tried, want) {
		t.Errorf("tried %v, want %v", tried, want)
	}
	if all := f.all(); len(all) != 1 || all[0].spot {
		t.Errorf("want one on-demand instance, got %+v", all)
	}
}

func TestThrottledCallsAreRetriedBySDK(t *testing.T) {
	// Given EC2 throttles the first two calls of each action.
	f := newFakeEC2(t)
	f.throttle = map[string]int{"RunInstances": 2, "DescribeInstances": 2, "TerminateInstances": 2}
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
	if n := f.count("RunInstances"); n != 3 {
		t.Errorf("%d RunInstances calls, want 3", n)
	}
	if n := f.count("TerminateInstances"); n != 3 {
		t.Errorf("%d TerminateInstances calls, want 3", n)
	}
	if n := len(f.all()); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}

	// And past MaxAttempts the throttling error is returned.
	f.mu.Lock()
	f.throttle["DescribeInstances"] = 3
	f.mu.Unlock()
	if _, err := b.List(bounded(t)); err == nil || !strings.Contains(err.Error(), "RequestLimitExceeded") {
		t.Errorf("want RequestLimitExceeded after 3 attempts, got %v", err)
	}
}

func TestStopTerminatesTheAttemptsInstance(t *testing.T) {
	// Given two attempts' instances.
	f := newFakeEC2(t)
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
	for _, i := range f.all() {
		stopped := i.state == "shutting-down" || i.state == "terminated"
		if stopped != (i.tags["berth:attempt"] == "berth-15-1") {
			t.Errorf("%s of %s is %s", i.id, i.tags["berth:attempt"], i.state)
		}
	}
	if n := f.count("TerminateInstances"); n != 1 {
		t.Errorf("%d TerminateInstances calls, want 1 (a shutting-down instance is already stopped)", n)
	}
}

func TestStopCountsAVanishedOrTerminatedInstanceAsStopped(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f := newFakeEC2(t)
	b := newBackend(t, f, func(o *ec2.Options) { o.Now = c.Now; o.NotFoundGrace = time.Minute })

	t.Run("gone from EC2", func(t *testing.T) {
		// Given an attempt whose instance EC2 no longer knows.
		v := vm(t, "berth-17-1")
		if err := b.Create(bounded(t), v); err != nil {
			t.Fatal(err)
		}
		f.vanish(f.all()[0].id)

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
		f.mu.Lock()
		f.instances[len(f.instances)-1].state = "terminated"
		f.mu.Unlock()
		if err := b.Stop(bounded(t), v); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("never launched", func(t *testing.T) {
		before := f.count("TerminateInstances")
		if err := b.Stop(bounded(t), vm(t, "berth-17-3")); err != nil {
			t.Fatal(err)
		}
		if f.count("TerminateInstances") != before {
			t.Error("terminated something for an attempt that has no instance")
		}
	})
}

func TestListReadsTheFleetsLiveInstancesByTag(t *testing.T) {
	// Given this fleet's instances in every state, another fleet's, and an
	// untagged one, over several pages.
	f := newFakeEC2(t)
	tag := func(fleet, attempt string) map[string]string {
		return map[string]string{"berth:fleet": fleet, "berth:attempt": attempt}
	}
	var want []string
	for n, state := range []string{"pending", "running", "running", "stopping", "stopped", "running", "running", "running"} {
		a := "berth-20-" + string(rune('a'+n))
		f.seed(state, tag("fleet-a", a))
		want = append(want, a)
	}
	f.seed("shutting-down", tag("fleet-a", "berth-21-1"))
	f.seed("terminated", tag("fleet-a", "berth-21-2"))
	f.seed("running", tag("fleet-b", "berth-21-3"))
	f.seed("running", nil)
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
	if n := f.count("DescribeInstances"); n != 2 {
		t.Errorf("%d DescribeInstances pages, want 2", n)
	}
}

func TestCallsEndWithTheirDeadline(t *testing.T) {
	for _, action := range []string{"RunInstances", "TerminateInstances", "DescribeInstances"} {
		t.Run(action, func(t *testing.T) {
			// Given EC2 never answers the action.
			f := newFakeEC2(t)
			b := newBackend(t, f, nil)
			v := vm(t, "berth-23-1")
			if action == "TerminateInstances" {
				if err := b.Create(bounded(t), v); err != nil {
					t.Fatal(err)
				}
			}
			f.mu.Lock()
			f.hang[action] = true
			f.mu.Unlock()

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
	f := newFakeEC2(t)
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
	if n := f.count("RunInstances"); n != 0 {
		t.Errorf("%d RunInstances calls, want 0", n)
	}
}

func TestAReusedTokenWithOtherParametersAdoptsTheAttemptsInstance(t *testing.T) {
	// Given an attempt launched, then the configuration changed (other
	// tags: the same token now comes with other parameters), while EC2's
	// reads still lag.
	f := newFakeEC2(t)
	f.hidden = true
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
	f.reveal()
	if err := b.Create(bounded(t), v); err != nil {
		t.Fatal(err)
	}
	if n := len(f.all()); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
}
