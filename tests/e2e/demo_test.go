package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/tests/harness"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

func demoOptions(t *testing.T, jobs int) harness.Options {
	return harness.Options{
		Jobs: jobs, MacOSShare: 0.3, FailShare: 0.1, Seed: 7,
		MinDuration: 100 * time.Millisecond, MaxDuration: 600 * time.Millisecond, Arrival: 3 * time.Second,
		DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", Timeout: 2 * time.Minute,
	}
}

// Given the whole system (embedded NATS, dispatcher, watchdog, two exec
// agents) and the GitHub simulator sending signed webhooks built from the
// real fixtures, when 60 jobs over two pools run to completion, then every
// job completed exactly once on one of Berth's runners, no slot is held, no
// VM is alive (in the fold and on the hosts' disks), the invariants hold, and
// a projection replayed from the log equals the live dispatcher's.
func TestDemoPathServesEveryJobOnceAndLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := demoOptions(t, 60)
	o.Warm = 2 // as make demo runs it: warm linux VMs beside cold starts
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := f.Drive(ctx, o)
	if err != nil {
		f.Stop()
		t.Fatal(err)
	}
	jobs := f.Sim.Jobs()
	checkSchemas(t, ctx, f.Sys.NATSURL)
	checkDashboard(t, ctx, f.Sys)
	if err := f.Stop(); err != nil {
		t.Errorf("shutdown: %v", err)
	}

	if rep.Served != o.Jobs || rep.Failed != 0 {
		t.Errorf("served %d of %d, failed %d", rep.Served, o.Jobs, rep.Failed)
	}
	for _, j := range jobs {
		if j.Completions != 1 {
			t.Errorf("job %d completed %d times", j.ID, j.Completions)
		}
	}
	if rep.SlotsHeld != 0 || rep.VMsAlive != 0 {
		t.Errorf("left behind: %d slots held, %d VMs alive", rep.SlotsHeld, rep.VMsAlive)
	}
	if len(rep.Violations) != 0 {
		t.Errorf("invariants broken: %v", rep.Violations)
	}
	if !rep.ReplayEqual {
		t.Errorf("a dispatcher restarted from the log would disagree with the live one:\n%s", rep.ReplayDiff)
	}
	if rep.Attempts < o.Jobs {
		t.Errorf("%d attempts for %d jobs", rep.Attempts, o.Jobs)
	}
}

// checkSchemas validates every stored envelope, and its data, against the
// checked-in JSON Schemas: what non-Go consumers rely on is what is written.
func checkSchemas(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	compile := func(name string) *jsonschema.Schema {
		s, err := c.Compile(filepath.Join(root, "schemas", name))
		if err != nil {
			t.Fatalf("compile schema %s: %v", name, err)
		}
		return s
	}
	envelope := compile("envelope.json")
	perType := map[string]*jsonschema.Schema{}
	for typ := range events.Types() {
		perType[typ] = compile(typ + ".json")
	}
	nc, js, err := eventlog.Connect(url, "schema-check")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cons, err := js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last, err := eventlog.LastSeq(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	validated := 0
	defer func() { t.Logf("validated %d envelopes against schemas/", validated) }()
	for seq := uint64(0); seq < last; {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read seq %d: %v", seq+1, err)
		}
		meta, _ := msg.Metadata()
		seq = meta.Sequence.Stream
		var env map[string]any
		if err := json.Unmarshal(msg.Data(), &env); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		if err := envelope.Validate(env); err != nil {
			t.Errorf("seq %d envelope: %v", seq, err)
		}
		typ, _ := env["type"].(string)
		s := perType[typ]
		if s == nil {
			t.Errorf("seq %d: type %q has no schema", seq, typ)
			continue
		}
		validated++
		if err := s.Validate(env["data"]); err != nil {
			t.Errorf("seq %d %s data: %v", seq, typ, err)
		}
	}
}
