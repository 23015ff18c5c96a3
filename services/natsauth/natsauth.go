// Package natsauth writes the NATS server's authorization for Berth: one
// account (BERTH, with JetStream) whose users are the roles, each
// identified by an nkey and allowed only what its role does, and a
// system-account user for `nats server report`. Every permission is made
// here, in one place; docs/security-nats.md renders the table (Table) and a
// test holds the two equal.
//
// What each role may publish (facts are berth.evt.<aggregate>.…):
//
//	dispatcher   job, pool (bookings and releases), attempt (placements, teardowns); never host facts
//	watchdog     pool (deadline releases), attempt (teardowns, abandonments), host (lost, cordon),
//	             demand, alarm; never job facts (it holds no GitHub credentials and mints nothing)
//	agent-HOST   its own host's facts and its own host's attempts only
//	cli          operator facts: host (cordon, drain), pool and attempt (berth release)
//	admin        one fact: a host's grant (berth.evt.host.<host>.admin, HostGranted: the pools
//	             a host may offer); it alone creates and updates the stream and the KV buckets
//	             (`berth stream apply`) and writes the trust bucket
//
// No role but admin may create, update, seal, delete or purge a stream or a
// KV bucket; services only verify that the stream is what they expect. The
// JetStream API of every role is an allow-list (API): stream and bucket
// info, direct gets (batched ones read the whole log without a consumer),
// KV writes only under the role's own keys (its snapshot, its parked
// records, an agent's heartbeat), and the role's own consumers on the log
// by their exact names: each dispatcher and watchdog replica's durable
// consumer (berth-<service>-<instance>, for the instances given to
// Generate), an agent's two (berth-agent-<host> and berth-hostwatch-<host>,
// held to its host's filters). Nobody else may create, inspect, pull from,
// acknowledge or delete them, and nobody but admin lists consumers. Each
// role receives replies only on its own inbox prefix (InboxPrefix), so no
// role sees another's deliveries. The watchdog alone watches the heartbeat
// bucket (a consumer there is a watchdog's). An agent reads only its own
// host's facts and placements. JIT configs are sealed to each agent's curve
// key as well.
package natsauth

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nkeys"
)

// Account names in the generated configuration.
const (
	Account       = "BERTH"
	SystemAccount = "SYS"
)

// Role names; an agent's role is AgentRole(host).
const (
	RoleDispatcher = "dispatcher"
	RoleWatchdog   = "watchdog"
	RoleCLI        = "cli"
	RoleAdmin      = "admin"
	RoleSystem     = "sys"
)

// InboxPrefix is the inbox prefix role's connections must use
// (nats.CustomInboxPrefix): the only subjects it may subscribe to are
// under it, so no role sees the replies (deliveries, KV reads, API
// answers) sent to another. With the nats CLI: --inbox-prefix.
func InboxPrefix(role string) string { return "_INBOX_" + role }

// AgentRole is the role of the agent of host.
func AgentRole(host string) string { return "agent-" + host }

// User is one generated identity.
type User struct {
	Role    string
	Account string
	Public  string   // the nkey's public key (U…), in the server config
	Seed    []byte   // the nkey's seed (SU…): the client's secret
	Publish []string // facts and KV keys the role writes
	// API is the JetStream API (and acks, flow control) the user may call.
	API []string
	// Deny is refused even where Publish or API would allow it.
	Deny []string
	// Subscribe is what the user may subscribe to: its own inboxes.
	Subscribe []string
}

// Auth is a generated authorization: the users, and the server config
// block that declares them.
type Auth struct {
	Users []User
}

// DefaultInstances are the replica names granted a consumer when none are
// given: a dispatcher or watchdog replica runs with one of them as its
// instance (config instance, or BERTH_INSTANCE).
var DefaultInstances = []string{"1", "2", "3"}

// Generate makes a fresh nkey for every role: the dispatcher, the
// watchdog, the cli, the admin, one agent per host, and the system user.
// Host and instance names must be valid subject tokens (events.ValidName);
// instances name the dispatcher and watchdog replicas (nil:
// DefaultInstances), each of which may read the log only through its own
// consumer, events.ServiceConsumer(service, instance).
func Generate(hosts, instances []string) (*Auth, error) {
	a := &Auth{}
	for _, h := range hosts {
		if err := events.ValidName("host", h); err != nil {
			return nil, err
		}
	}
	for _, in := range instances {
		if err := events.ValidName("instance", in); err != nil {
			return nil, err
		}
	}
	for _, u := range Permissions(hosts, instances) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		u.Public, _ = kp.PublicKey()
		u.Seed, _ = kp.Seed()
		a.Users = append(a.Users, u)
	}
	return a, nil
}

// Permissions is every role's permissions, without keys: what Generate
// hands out and Table renders. instances nil means DefaultInstances.
func Permissions(hosts, instances []string) []User {
	if len(instances) == 0 {
		instances = DefaultInstances
	}
	p := events.SubjectPrefix
	mk := func(role, account string, publish, api []string) User {
		u := User{Role: role, Account: account, Publish: publish, API: api}
		if account == Account {
			u.Subscribe = []string{InboxPrefix(role) + ".>"}
			u.Deny = serviceDeny
		}
		return u
	}
	snapshots := func(key string) []string {
		return []string{kv(events.BucketSnapshots, key), kv(events.BucketSnapshots, events.SnapshotParts(key))}
	}
	parked := func(key string) string { return kv(events.BucketParked, key+".>") }
	users := []User{
		mk(RoleDispatcher, Account, concat([]string{p + ".job.>"}, authored(events.RoleDispatcher, ".pool.*", ".attempt.*.*"),
			snapshots(events.SnapshotKeyDispatcher), []string{parked(events.SnapshotKeyDispatcher), kv(events.BucketScaleSets, ">")}),
			concat(readerAPI(), serviceConsumers("dispatcher", instances))),
		mk(RoleWatchdog, Account, concat(authored(events.RoleWatchdog, ".pool.*", ".attempt.*.*", ".host.*"), []string{p + ".demand.>", p + ".alarm.>"},
			snapshots(events.SnapshotKeyWatchdog), []string{parked(events.SnapshotKeyWatchdog), kv(events.BucketHeartbeats, events.HeartbeatProbeKey)}),
			concat(readerAPI(), serviceConsumers("watchdog", instances), heartbeatWatch())),
		mk(RoleCLI, Account, authored(events.RoleCLI, ".host.*", ".pool.*", ".attempt.*.*"), readerAPI()),
	}
	for _, h := range hosts {
		snap := events.SnapshotKeyAgent(h)
		users = append(users, mk(AgentRole(h), Account, concat(authored(events.RoleAgent, ".host."+h, ".attempt."+h+".*"),
			[]string{kv(events.BucketHeartbeats, h)}, snapshots(snap), []string{parked(snap)}), agentAPI(h)))
	}
	admin := mk(RoleAdmin, Account, concat(authored(events.RoleAdmin, ".host.*"), []string{kv(events.BucketTrust, ">")}), []string{"$JS.API.>", "$JS.ACK.>", "$JS.FC.>"})
	admin.Deny = adminDeny
	// An operator's `berth status` with the admin key still asks on the cli's inbox.
	admin.Subscribe = append(admin.Subscribe, InboxPrefix(RoleCLI)+".>")
	return append(users, admin, mk(RoleSystem, SystemAccount, nil, nil))
}

func kv(bucket, key string) string { return "$KV." + bucket + "." + key }

func concat(ss ...[]string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s...)
	}
	return out
}

// buckets is every KV bucket, each the stream KV_<bucket>.
var buckets = []string{events.BucketSnapshots, events.BucketHeartbeats, events.BucketParked, events.BucketTrust, events.BucketScaleSets}

// ownConsumer is the JetStream API of one consumer on the log that its
// owner alone may use, by its exact name: create it (with the filter in the
// create subject when filter is set, so the server holds it to that
// filter; with any filter otherwise), read its info, pull from it, delete
// it, and, when acks, acknowledge its messages. A consumer name is one
// subject token and a permission's wildcard matches a whole token, so no
// prefix can be granted: every name is listed.
func ownConsumer(name, filter string, acks bool) []string {
	const api, log = "$JS.API.", events.StreamName
	create := []string{api + "CONSUMER.CREATE." + log + "." + name, api + "CONSUMER.CREATE." + log + "." + name + ".>"}
	if filter != "" {
		create = []string{api + "CONSUMER.CREATE." + log + "." + name + "." + filter}
	}
	out := append(create, api+"CONSUMER.INFO."+log+"."+name, api+"CONSUMER.DELETE."+log+"."+name,
		api+"CONSUMER.MSG.NEXT."+log+"."+name)
	if acks {
		out = append(out, "$JS.ACK."+log+"."+name+".>")
	}
	return out
}

// serviceConsumers is every replica's own durable consumer of a dispatcher
// or watchdog (events.ServiceConsumer).
func serviceConsumers(service string, instances []string) []string {
	var out []string
	for _, in := range instances {
		out = append(out, ownConsumer(events.ServiceConsumer(service, in), "", true)...)
	}
	return out
}

// heartbeatWatch is the watchdog's watch of the heartbeat bucket (an
// ordered push consumer nats.go names at random, with flow control). No
// other role may make a consumer on that bucket, so the only consumers
// there are watchdogs' own.
func heartbeatWatch() []string {
	const api, hb = "$JS.API.", "KV_" + events.BucketHeartbeats
	return []string{api + "CONSUMER.CREATE." + hb + ".*", api + "CONSUMER.CREATE." + hb + ".*.>",
		api + "CONSUMER.INFO." + hb + ".*", api + "CONSUMER.DELETE." + hb + ".*", "$JS.FC." + hb + ".>"}
}

// readerAPI is the JetStream API of a role that reads the whole log: the
// stream's info (never its create or update), message gets (`nats stream
// get`) and direct gets on it (single, and batched: eventlog.Scan reads the
// log with them, no consumer needed),
// and every bucket's info and direct gets. No consumer: a role's own are
// granted by name (ownConsumer).
func readerAPI() []string {
	const api, log = "$JS.API.", events.StreamName
	out := []string{api + "INFO", api + "STREAM.INFO." + log, api + "STREAM.MSG.GET." + log, api + "DIRECT.GET." + log, api + "DIRECT.GET." + log + ".>"}
	for _, b := range buckets {
		out = append(out, api+"STREAM.INFO.KV_"+b, api+"DIRECT.GET.KV_"+b+".>")
	}
	return out
}

// authored is the subjects of the given aggregates (under the prefix) that
// role writes: each ends in the role's token, the only one the server
// lets it publish there (events/authority.go).
func authored(role events.Role, aggregates ...string) []string {
	out := make([]string, len(aggregates))
	for i, a := range aggregates {
		out[i] = events.SubjectPrefix + a + "." + string(role)
	}
	return out
}

// User returns the user of role, or nil.
func (a *Auth) User(role string) *User {
	for i := range a.Users {
		if a.Users[i].Role == role {
			return &a.Users[i]
		}
	}
	return nil
}

// Config is the server configuration block (accounts and system_account),
// to include from nats-server.conf. It holds public keys only.
func (a *Auth) Config() string {
	var b strings.Builder
	b.WriteString("# Berth's NATS authorization, written by `berth nats-auth`. Public keys only:\n")
	b.WriteString("# each service connects with its seed file (nats.nkey_file). Regenerate to rotate.\n")
	b.WriteString("accounts {\n")
	for _, acct := range []string{Account, SystemAccount} {
		fmt.Fprintf(&b, "  %s {\n", acct)
		if acct == Account {
			b.WriteString("    jetstream: enabled\n")
		}
		b.WriteString("    users: [\n")
		for _, u := range a.Users {
			if u.Account != acct {
				continue
			}
			fmt.Fprintf(&b, "      # %s\n      {nkey: %s", u.Role, u.Public)
			if u.Account == Account {
				b.WriteString(", permissions: {\n")
				fmt.Fprintf(&b, "        publish: {allow: [%s],\n", quoteAll(concat(u.Publish, u.API)))
				fmt.Fprintf(&b, "                  deny: [%s]}\n", quoteAll(u.Deny))
				fmt.Fprintf(&b, "        subscribe: {allow: [%s]}\n      }", quoteAll(u.Subscribe))
			}
			b.WriteString("}\n")
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "system_account: %s\n", SystemAccount)
	return b.String()
}

// agentAPI is the JetStream API an agent may call (not the log's info): its two consumers on
// the log by their exact names, each held to its own host's filter (the
// server checks the filter in the create subject against the request):
// its durable one on its attempts (events.AgentConsumer) and the watch of
// its host's facts (events.HostWatchConsumer); direct gets only of its own
// subjects; and of the buckets the heartbeats, the trust keys, the parked
// records and its own snapshot only. So an agent reads nothing of other
// hosts' placements, jobs or bookings, nor their snapshots, and touches no
// consumer but its own.
func agentAPI(host string) []string {
	const api, log = "$JS.API.", events.StreamName
	// No STREAM.INFO on the log: permissions cannot see a request's
	// subjects_filter, so it would list every subject (every host, pool
	// and attempt). An agent checks the log by direct gets of its own
	// subjects (eventlog.LastOn, StreamThere).
	out := concat([]string{api + "INFO"},
		ownConsumer(events.AgentConsumer(host), events.HostAttemptsFilter(host), true),
		ownConsumer(events.HostWatchConsumer(host), events.HostFilter(host), false))
	for _, s := range []string{events.HostAttemptsFilter(host), events.HostFilter(host)} {
		out = append(out, api+"DIRECT.GET."+log+"."+s)
	}
	// A KV bucket B is the stream KV_B; its key K is the subject $KV.B.K.
	for _, b := range buckets {
		out = append(out, api+"STREAM.INFO.KV_"+b)
	}
	snap := "KV_" + events.BucketSnapshots + "." + kv(events.BucketSnapshots, events.SnapshotKeyAgent(host))
	return append(out, api+"DIRECT.GET.KV_"+events.BucketHeartbeats+".>", api+"DIRECT.GET.KV_"+events.BucketParked+".>",
		api+"DIRECT.GET.KV_"+events.BucketTrust+".>", api+"DIRECT.GET."+snap, api+"DIRECT.GET."+events.SnapshotParts(snap)) // a snapshot in parts
}

// serviceDeny is refused to every role but admin and sys whatever else
// allows it: creating, updating (sealing), deleting or purging a stream or
// bucket, deleting a message, listing consumers, writing the trust keys.
var serviceDeny = []string{"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
	"$JS.API.STREAM.PURGE.>", "$JS.API.STREAM.MSG.DELETE.>", "$JS.API.CONSUMER.LIST.>", "$JS.API.CONSUMER.NAMES.>",
	"$KV." + events.BucketTrust + ".>"}

// adminDeny: not even the admin deletes or purges the log (the stream
// denies message deletes and purges too).
var adminDeny = []string{"$JS.API.STREAM.DELETE." + events.StreamName, "$JS.API.STREAM.PURGE." + events.StreamName}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = `"` + s + `"`
	}
	return strings.Join(q, ", ")
}

// Write puts the config block in dir/auth.conf (0644) and each user's seed
// in dir/<role>.nk (0600), and returns the files written, sorted.
func (a *Auth) Write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "auth.conf")
	if err := os.WriteFile(conf, []byte(a.Config()), 0o644); err != nil {
		return nil, err
	}
	files := []string{conf}
	for _, u := range a.Users {
		f := filepath.Join(dir, u.Role+".nk")
		if err := os.WriteFile(f, append(append([]byte(nil), u.Seed...), '\n'), 0o600); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	sort.Strings(files)
	return files, nil
}

// Table renders every role's permissions as a Markdown table (hosts stand
// for the agents, e.g. "HOST", instances for the replicas, e.g.
// "INSTANCE"): docs/security-nats.md holds it between TableBegin and
// TableEnd, and a test keeps the two equal.
func Table(hosts, instances []string) string {
	var b strings.Builder
	b.WriteString("| role (seed file) | may publish: facts and KV keys | JetStream API, acks | denied | may subscribe |\n")
	b.WriteString("| --- | --- | --- | --- | --- |\n")
	cell := func(ss []string) string {
		if len(ss) == 0 {
			return "—"
		}
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = "`" + s + "`"
		}
		return strings.Join(q, "<br>")
	}
	for _, u := range Permissions(hosts, instances) {
		if u.Account != Account {
			fmt.Fprintf(&b, "| %s (`%s.nk`) | system account %s: `nats server report` | — | — | — |\n", u.Role, u.Role, u.Account)
			continue
		}
		fmt.Fprintf(&b, "| %s (`%s.nk`) | %s | %s | %s | %s |\n", u.Role, u.Role, cell(u.Publish), cell(u.API), cell(u.Deny), cell(u.Subscribe))
	}
	return b.String()
}

// The markers around the generated table in docs/security-nats.md.
const (
	TableBegin = "<!-- natsauth.Table: begin (generated; go test ./services/natsauth -update-doc) -->"
	TableEnd   = "<!-- natsauth.Table: end -->"
)
