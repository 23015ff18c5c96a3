package procs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// attackers are the roles the attack suite plays, each with its real key.
var attackers = []string{natsauth.RoleDispatcher, natsauth.RoleWatchdog, natsauth.AgentRole("host-a"), natsauth.RoleCLI}

// act is one forbidden thing a role tries: a request or publish on a
// subject (the JetStream API is plain NATS requests), or a subscription.
type act struct {
	name    string
	subject string // published (or requested) on
	sub     string // subscribed to instead, when set
	body    string
}

// forbidden is what role may not do (law 10): reconfigure, seal, purge or
// delete the log or a bucket, make a stream, delete a fact, list the
// consumers (and so learn another's name), create a consumer the old way
// (its name only in the body) or under another's name, read another
// role's inbox or the server's advisories, write another's KV keys or the
// trust bucket.
func forbidden(role, victim string, cur jetstream.StreamConfig) []act {
	const api, log = "$JS.API.", events.StreamName
	update := func(sealed bool) string {
		c := cur
		c.MaxMsgs, c.Sealed = 5, sealed
		b, _ := json.Marshal(c)
		return string(b)
	}
	kv := func(bucket, key string) string { return "$KV." + bucket + "." + key }
	acts := []act{
		{name: "shorten the log to 5 facts", subject: api + "STREAM.UPDATE." + log, body: update(false)},
		{name: "seal the log", subject: api + "STREAM.UPDATE." + log, body: update(true)},
		{name: "purge the log", subject: api + "STREAM.PURGE." + log, body: `{}`},
		{name: "delete the log", subject: api + "STREAM.DELETE." + log},
		{name: "delete a fact", subject: api + "STREAM.MSG.DELETE." + log, body: `{"seq":1}`},
		{name: "create a stream", subject: api + "STREAM.CREATE.EVIL", body: `{"name":"EVIL","subjects":["evil.>"]}`},
		{name: "update the snapshot bucket", subject: api + "STREAM.UPDATE.KV_" + events.BucketSnapshots, body: `{"name":"KV_` + events.BucketSnapshots + `","max_msgs":1}`},
		{name: "delete the heartbeat bucket", subject: api + "STREAM.DELETE.KV_" + events.BucketHeartbeats},
		{name: "create a bucket", subject: api + "STREAM.CREATE.KV_berth_evil", body: `{"name":"KV_berth_evil","subjects":["$KV.berth_evil.>"]}`},
		{name: "list the consumers", subject: api + "CONSUMER.LIST." + log, body: `{}`},
		{name: "list the consumer names", subject: api + "CONSUMER.NAMES." + log, body: `{}`},
		{name: "create an ephemeral consumer named in the body", subject: api + "CONSUMER.CREATE." + log,
			body: `{"stream_name":"` + log + `","config":{"name":"` + victim + `","ack_policy":"explicit"}}`},
		{name: "create a legacy durable under another's name", subject: api + "CONSUMER.DURABLE.CREATE." + log + "." + victim,
			body: `{"stream_name":"` + log + `","config":{"durable_name":"` + victim + `","ack_policy":"explicit"}}`},
		{name: "read every inbox", sub: "_INBOX.>"},
		{name: "read another role's inbox", sub: natsauth.InboxPrefix(other(role)) + ".>"},
		{name: "read the server's advisories", sub: "$JS.EVENT.>"},
		{name: "read the log's deliveries directly", sub: events.SubjectAll},
		{name: "write host-b's heartbeat", subject: kv(events.BucketHeartbeats, "host-b"), body: `{"host":"host-b"}`},
		{name: "write a trust key", subject: kv(events.BucketTrust, "dispatcher"), body: `forged`},
		{name: "write another's parked record", subject: kv(events.BucketParked, otherSnapshot(role)+".1"), body: `{}`},
		{name: "write another's snapshot", subject: kv(events.BucketSnapshots, otherSnapshot(role)), body: `forged`},
		{name: "write another's snapshot part", subject: kv(events.BucketSnapshots, events.SnapshotPartKey(otherSnapshot(role), 1, 0)), body: `forged`},
	}
	if strings.HasPrefix(role, natsauth.AgentRole("")) {
		// Issue 16, F2: NATS cannot see a STREAM.INFO request's
		// subjects_filter, so with that right an agent listed every
		// subject of the log: every host, pool and attempt.
		acts = append(acts, act{name: "list the log's subjects (stream info)", subject: api + "STREAM.INFO." + log,
			body: `{"subjects_filter":">"}`})
	}
	return acts
}

// other is a role other than role, whose inbox and keys role must not touch.
func other(role string) string {
	if role == natsauth.RoleDispatcher {
		return natsauth.RoleWatchdog
	}
	return natsauth.RoleDispatcher
}

func otherSnapshot(role string) string {
	if role == natsauth.RoleDispatcher {
		return events.SnapshotKeyWatchdog
	}
	return events.SnapshotKeyDispatcher
}

// roleConn connects as role with its seed, on its own inbox prefix, and
// returns the connection and the server's asynchronous errors.
func roleConn(t *testing.T, sys *System, role string) (*nats.Conn, <-chan error) {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(filepath.Join(sys.AuthDir, role+".nk"))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1024)
	var nc *nats.Conn
	for try := 0; try < 3; try++ { // a loaded machine may drop a connection being made
		nc, err = nats.Connect(sys.NATS.URL(), opt, nats.Timeout(2*time.Second), nats.CustomInboxPrefix(natsauth.InboxPrefix(role)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case errc <- err:
				default:
				}
			}))
		if err == nil || errors.Is(err, nats.ErrAuthorization) {
			break
		}
	}
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	return nc, errc
}

// try does a on a fresh connection as role and reports whether the server
// refused it with a permissions violation naming its subject (an API error
// is not enough: it may be refusing the request's shape, not the role). It
// returns what happened otherwise.
func try(t *testing.T, sys *System, role string, a act) (bool, string) {
	nc, errc := roleConn(t, sys, role)
	defer nc.Close()
	subj := a.subject
	if a.sub != "" {
		subj = a.sub
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan string, 1)
	go func() { done <- do(ctx, nc, a) }()
	for {
		select {
		case err := <-errc:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subj) {
				return true, err.Error()
			}
		case what := <-done:
			if what != "" {
				return false, what
			}
			done = nil // subscribed: wait for the server's verdict
		case <-ctx.Done():
			return false, "no refusal within 3s"
		}
	}
}

// do performs a and says what came of it ("" for a subscription that is
// in place, whose refusal comes asynchronously).
func do(ctx context.Context, nc *nats.Conn, a act) string {
	if a.sub != "" {
		s, err := nc.SubscribeSync(a.sub)
		if err != nil {
			return "subscribe: " + err.Error()
		}
		_ = s // closed with the connection
		_ = nc.FlushTimeout(2 * time.Second)
		return ""
	}
	// The JetStream API is requests; a KV write a JetStream publish,
	// which the stream acks when it stores it.
	resp, err := nc.RequestWithContext(ctx, a.subject, []byte(a.body))
	if err != nil {
		return "no answer: " + err.Error()
	}
	var r struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if json.Unmarshal(resp.Data, &r) == nil && r.Error != nil {
		return "API error: " + r.Error.Description
	}
	return "answered: " + string(resp.Data)
}

// Given the services running on NATS with the generated authorization and
// a few jobs served, when each role (dispatcher, watchdog, agent-host-a,
// cli) with its own real key tries every act law 10 forbids it, then the
// server refuses each one; and when each role publishes, on every subject
// it may write, a fact of every type it does not author and facts naming
// another host or pool, then each is refused by the server or, stored,
// refused and counted by every service that reads it (refused_facts on
// /healthz), with nothing in the fold changed (a replay as `berth status`
// does equals the one before) and no VM created.
func TestEveryRoleIsRefusedWhatLaw10Forbids(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and the services as processes")
	}
	t.Parallel()
	sys := Start(t, Options{Auth: true})
	for range 6 {
		sys.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 100 * time.Millisecond})
	}
	sys.AwaitQuiet(60*time.Second, nil)
	consumers, cur := consumersOnTheLog(t, sys)

	var wg sync.WaitGroup
	// Each act opens its own connection; at most 16 at once, so that a
	// loaded machine does not refuse the suite's own connections.
	slots := make(chan struct{}, 16)
	for _, role := range attackers {
		acts := forbidden(role, others(role, consumers)[0], cur)
		for _, victim := range others(role, consumers) {
			acts = append(acts, touch(victim)...)
		}
		for _, a := range acts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				slots <- struct{}{}
				defer func() { <-slots }()
				if ok, what := try(t, sys, role, a); !ok {
					t.Errorf("%s could %s (%s%s): %s", role, a.name, a.subject, a.sub, what)
				}
			}()
		}
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := sys.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refusedBefore := refusedFacts(t, sys)
	creates := createCalls(t, sys)
	stored := forgeAll(t, sys, ctx, before, attemptOn(t, before, "host-b"))
	if len(stored) == 0 {
		t.Fatal("no forged fact reached the log: the shell's half of the suite checked nothing")
	}
	// Every stored forgery is refused by each service that reads the whole log.
	testkit.EventuallyErr(t, 30*time.Second, "every service refuses every stored forgery", func() error {
		now := refusedFacts(t, sys)
		for svc, n := range now {
			if n < refusedBefore[svc]+uint64(len(stored)) {
				return fmt.Errorf("%s refused %d, want %d more than %d", svc, n, len(stored), refusedBefore[svc])
			}
		}
		return nil
	})
	// The watchdog raises the alarm in the round after it refused them: on
	// a quiet machine this check once ran before that round's append.
	var after *events.Fleet
	testkit.EventuallyErr(t, 30*time.Second, "the forged-fact alarm stored", func() error {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		var err error
		if after, err = sys.Replay(rctx); err != nil {
			return err
		}
		if !slices.ContainsFunc(after.Status().Alarms, func(a events.AlarmView) bool { return a.Kind == forgedAlarm }) {
			return fmt.Errorf("no %s alarm after %d refused facts: %+v", forgedAlarm, len(stored), after.Status().Alarms)
		}
		return nil
	})
	if b, a := view(before), view(after); !reflect.DeepEqual(b, a) {
		t.Errorf("the fold changed under forged facts:\nbefore %+v\nafter  %+v", b, a)
	}
	if after.Status().Skipped != before.Status().Skipped+len(stored) {
		t.Errorf("the replay skipped %d facts, want %d (before) + %d forged", after.Status().Skipped, before.Status().Skipped, len(stored))
	}
	testkit.Consistently(t, 2*time.Second, "no VM created for a forgery", func() bool { return createCalls(t, sys) == creates })
	t.Logf("%d forged facts the server let through on the roles' own subjects, all refused by the services", len(stored))
}

// forgeAll publishes, as each attacker, every forgery on the subjects it
// may write, and returns the ids of those the log stored.
func forgeAll(t *testing.T, sys *System, ctx context.Context, fold *events.Fleet, hostB string) []string {
	t.Helper()
	var ids []string
	n := 0
	for _, role := range attackers {
		nc, _ := roleConn(t, sys, role)
		fs := forgeries(role)
		if role == natsauth.AgentRole("host-a") {
			fs = append(fs, crossHost(hostB)...)
		}
		for _, f := range fs {
			n++
			f.ev.ID = fmt.Sprintf("forged-%s-%d", role, n)
			b, err := events.Marshal(f.ev)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Publish(f.ev.Subject, b); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, f.ev.ID)
		}
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// One more forgery, published with an ack: the stream stores what it is
	// sent in order, so once this one is acked every forgery flushed before
	// it is stored or was refused, and its sequence is where to read up to.
	marker := events.NewBy("attacker", events.RoleCLI, time.Now(), &events.JobCompleted{JobRef: events.JobRef{JobID: 424242}})
	marker.ID, marker.Subject = "forged-marker", events.HostSubject("host-a")+"."+string(events.RoleCLI)
	b, err := events.Marshal(marker)
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := roleConn(t, sys, natsauth.RoleCLI)
	cjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := cjs.Publish(ctx, marker.Subject, b)
	if err != nil {
		t.Fatalf("the marker forgery on the cli's own subject was not stored: %v", err)
	}
	ids = append(ids, marker.ID)
	last := ack.Sequence
	// Read as the cli reads (batched direct gets: it holds no consumer).
	var stored []string
	if _, err := eventlog.Scan(ctx, sys.JetStream(), events.SubjectAll, 1, last, func(d eventlog.Delivered) error {
		ev := d.Event
		if d.Err == nil && strings.HasPrefix(ev.ID, "forged-") {
			if _, err := events.Admit(fold, ev); err == nil {
				t.Errorf("forgery %s (%s on %s) passes events.Admit: the suite built a legitimate fact", ev.ID, ev.Type(), ev.Subject)
			}
			stored = append(stored, ev.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d forgeries published, %d stored (the rest refused by the server)", len(ids), len(stored))
	return stored
}

type forgery struct{ ev events.Event }

// forgeries is every fact role may not write, on every subject it may:
// each type it does not author, about its own host or pool and another's,
// stored on its own token (the only one the server lets it use) for either;
// and each type it does author, naming another host or pool than the
// subject it is stored on.
func forgeries(role string) []forgery {
	token := events.Role(role)
	hosts := []string{"host-a", "host-b"}
	if strings.HasPrefix(role, "agent-") {
		token = events.RoleAgent
	}
	var out []forgery
	types := events.Types()
	names := make([]string, 0, len(types))
	for typ := range types {
		names = append(names, typ)
	}
	sort.Strings(names)
	for _, typ := range names {
		author := slices.Contains(events.Authors(typ), token)
		for i, claim := range hosts {
			for j, store := range hosts {
				p := payload(typ, claim, []string{"linux", "macos"}[i])
				where := payload(typ, store, []string{"linux", "macos"}[j])
				if author && p.EventSubject() == where.EventSubject() {
					continue // its own fact, truthfully stored: not a forgery
				}
				ev := events.NewBy("berth/attack/"+role, token, time.Now(), p)
				ev.Subject = events.SubjectBy(where, token)
				out = append(out, forgery{ev})
			}
		}
	}
	return out
}

// crossHost is what host-a's agent writes, on its own attempt subjects and
// truthfully as to its own host, about an attempt booked on host-b
// (hostB), and about an attempt nobody booked: every agent fact type on an
// attempt. Each passes events.Authorize (its subject confirms host-a and
// the id); only the fold knows the id is host-b's or nobody's, and must
// refuse it (else host-a could fail or stop host-b's attempts and have
// their slots released, or claim a future attempt id first).
func crossHost(hostB string) []forgery {
	var out []forgery
	for typ := range events.Types() {
		if !slices.Contains(events.Authors(typ), events.RoleAgent) {
			continue
		}
		for _, id := range []string{hostB, "berth-999002-1"} {
			p := events.Types()[typ]
			b, _ := json.Marshal(map[string]any{"attempt": id, "host": "host-a", "pool": "linux", "step": "drain",
				"culprit": "job", "job_id": 999002})
			_ = json.Unmarshal(b, p)
			if !strings.HasPrefix(p.EventSubject(), events.AttemptSubject("host-a", id)) {
				continue // not an attempt fact
			}
			ev := events.NewBy("berth/attack/agent-host-a", events.RoleAgent, time.Now(), p)
			ev.Subject = events.SubjectBy(p, events.RoleAgent)
			out = append(out, forgery{ev})
		}
	}
	return out
}

// attemptOn is an attempt the fold holds on host, for crossHost.
func attemptOn(t *testing.T, f *events.Fleet, host string) string {
	t.Helper()
	for id, a := range f.Attempts {
		if a.Host == host && a.Placed {
			return id
		}
	}
	t.Fatalf("no attempt was placed on %s: the cross-host forgeries would test nothing", host)
	return ""
}

// payload is a fact of type typ about host and pool (and job 999001, its
// attempt on host).
func payload(typ, host, pool string) events.Payload {
	p := events.Types()[typ]
	b, _ := json.Marshal(map[string]any{"job_id": 999001, "pool": pool, "host": host, "attempt": "berth-999001-1",
		"labels": []string{"self-hosted", pool}, "key": "forged", "slots": 1, "runner_name": "berth-999001-1"})
	_ = json.Unmarshal(b, p)
	return p
}

// view is the part of a fold's status that a forgery must not change: all
// of it but the alarm the watchdog raises on refused facts (law 10: count,
// park and alarm), kind forgedAlarm.
func view(f *events.Fleet) any {
	st := f.Status()
	var pools []events.PoolStatus
	for _, p := range st.Pools {
		p.Alarms = slices.DeleteFunc(slices.Clone(p.Alarms), func(k string) bool { return strings.HasPrefix(k, forgedAlarm+"/") })
		if p.Capacity == 0 && len(p.Labels) == 0 && len(p.Alarms) == 0 {
			continue // the pool entry only the alarm made
		}
		pools = append(pools, p)
	}
	alarms := slices.DeleteFunc(slices.Clone(st.Alarms), func(a events.AlarmView) bool { return a.Kind == forgedAlarm })
	return struct {
		Pools     []events.PoolStatus
		Hosts     []events.HostStatus
		Jobs      events.JobCounts
		Alarms    []events.AlarmView
		Abandoned []events.AbandonedVM
	}{pools, st.Hosts, st.Jobs, alarms, st.Abandoned}
}

const forgedAlarm = "forged_fact"

// refusedFacts reads refused_facts from the /healthz of the services that
// fold the whole log (and checks they report no stream_drift).
func refusedFacts(t *testing.T, sys *System) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	c := &http.Client{Timeout: 5 * time.Second}
	for _, base := range append(append([]string{}, sys.DispatcherURLs...), sys.WatchdogURLs...) {
		resp, err := c.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		var h struct {
			Detail struct {
				Refused uint64   `json:"refused_facts"`
				Drift   []string `json:"stream_drift"`
			} `json:"detail"`
		}
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if h.Detail.Drift == nil || len(h.Detail.Drift) > 0 {
			t.Errorf("%s/healthz: stream_drift %v, want [] (the stream is as `berth stream apply` made it)", base, h.Detail.Drift)
		}
		out[base] = h.Detail.Refused
	}
	return out
}

// createCalls counts the exec backend's create steps on every host.
func createCalls(t *testing.T, sys *System) int {
	t.Helper()
	n := 0
	for _, a := range sys.Config.Agents {
		b, err := os.ReadFile(filepath.Join(sys.FaultDir(a.Host), "calls"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		n += strings.Count(string(b), "create start ")
	}
	return n
}

// consumersOnTheLog is every consumer on the log, as only the admin may
// list them, and the stream's configuration. The services' consumers must
// be there under their exact names, or the suite would try nothing.
func consumersOnTheLog(t *testing.T, sys *System) ([]string, jetstream.StreamConfig) {
	t.Helper()
	nc, _ := roleConn(t, sys, natsauth.RoleAdmin)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	names := st.ConsumerNames(ctx)
	for n := range names.Name() {
		out = append(out, n)
	}
	for _, want := range []string{events.ServiceConsumer("dispatcher", "1"), events.ServiceConsumer("watchdog", "1"),
		events.AgentConsumer("host-a"), events.HostWatchConsumer("host-a"), events.AgentConsumer("host-b")} {
		if !slices.Contains(out, want) {
			t.Fatalf("the admin lists no consumer %s (%v; %v)", want, out, names.Err())
		}
	}
	return out, st.CachedInfo().Config
}

// owns tells whether consumer name is role's own (the names natsauth grants).
func owns(role, name string) bool {
	switch role {
	case natsauth.RoleDispatcher:
		return strings.HasPrefix(name, "berth-dispatcher-")
	case natsauth.RoleWatchdog:
		return strings.HasPrefix(name, "berth-watchdog-")
	case natsauth.AgentRole("host-a"):
		return name == events.AgentConsumer("host-a") || name == events.HostWatchConsumer("host-a")
	}
	return false
}

// others is every consumer in names that is not role's.
func others(role string, names []string) []string {
	var out []string
	for _, n := range names {
		if !owns(role, n) {
			out = append(out, n)
		}
	}
	return out
}

// touch is what a role may not do to another's consumer (law 10): read its
// state, pull its deliveries (which also pushes them towards the poison
// limit), acknowledge one (so its owner never folds it), delete it (its
// owner then acts on a partial view until it notices), or make it anew.
func touch(victim string) []act {
	const api, log = "$JS.API.", events.StreamName
	return []act{
		{name: "inspect " + victim, subject: api + "CONSUMER.INFO." + log + "." + victim},
		{name: "pull from " + victim, subject: api + "CONSUMER.MSG.NEXT." + log + "." + victim, body: `{"batch":1,"expires":1000000000}`},
		{name: "ack on " + victim, subject: "$JS.ACK." + log + "." + victim + ".1.2.2.1700000000000000000.0", body: "+ACK"},
		{name: "delete " + victim, subject: api + "CONSUMER.DELETE." + log + "." + victim},
		{name: "create " + victim + " anew", subject: api + "CONSUMER.CREATE." + log + "." + victim + "." + events.SubjectAll,
			body: `{"stream_name":"` + log + `","config":{"name":"` + victim + `","filter_subject":"` + events.SubjectAll + `","ack_policy":"none"}}`},
	}
}
