// Package natsauth writes the NATS server's authorization for Berth: one
// account (BERTH, with JetStream) whose users are the services, each
// identified by an nkey and allowed to publish only the facts its role
// emits, and a system-account user for `nats server report`.
//
// What each role may publish (facts are berth.evt.<aggregate>.…):
//
//	dispatcher   job, pool (bookings and releases), attempt (placements, teardowns); never host facts
//	watchdog     pool (deadline releases), attempt (teardowns, abandonments), host (lost, cordon),
//	             demand, alarm; never job facts (it holds no GitHub credentials and mints nothing)
//	agent-HOST   its own host's facts and its own host's attempts only
//	cli          operator facts: host (cordon, drain), pool and attempt (berth release)
//
// Every Berth user may use the JetStream API ($JS.API.>, acks, flow
// control) except deleting or purging a stream, write the KV buckets its
// role keeps (snapshots, parked facts, heartbeats), and subscribe to its
// own inboxes. An agent reads only its own host's facts and placements: it
// may create consumers on the log only with its own host's filter (one
// filter each, which the server sees in the create subject) and get
// messages directly only from its own subjects. JIT configs are sealed to
// each agent's curve key as well.
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
	RoleSystem     = "sys"
)

// AgentRole is the role of the agent of host.
func AgentRole(host string) string { return "agent-" + host }

// User is one generated identity.
type User struct {
	Role    string
	Account string
	Public  string // the nkey's public key (U…), in the server config
	Seed    []byte // the nkey's seed (SU…): the client's secret
	Publish []string
	// API is the JetStream API the user may call; nil means all of it but
	// deleting or purging a stream.
	API []string
}

// Auth is a generated authorization: the users, and the server config
// block that declares them.
type Auth struct {
	Users []User
}

// Generate makes a fresh nkey for every role: the dispatcher, the
// watchdog, the cli, one agent per host, and the system user. Host names
// must be valid subject tokens (events.ValidName).
func Generate(hosts []string) (*Auth, error) {
	a := &Auth{}
	add := func(role, account string, publish []string) error {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return err
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		a.Users = append(a.Users, User{Role: role, Account: account, Public: pub, Seed: seed, Publish: publish})
		return nil
	}
	p := events.SubjectPrefix
	kv := func(bucket, key string) string { return "$KV." + bucket + "." + key }
	roles := []struct {
		role    string
		publish []string
	}{
		{RoleDispatcher, append([]string{p + ".job.>"}, authored(events.RoleDispatcher, ".pool.*", ".attempt.*.*")...)},
		{RoleWatchdog, append(authored(events.RoleWatchdog, ".pool.*", ".attempt.*.*", ".host.*"), p+".demand.>", p+".alarm.>")},
		{RoleCLI, authored(events.RoleCLI, ".host.*", ".pool.*", ".attempt.*.*")},
	}
	kvs := map[string][]string{
		RoleDispatcher: {kv(events.BucketSnapshots, ">"), kv(events.BucketParked, ">")},
		RoleWatchdog:   {kv(events.BucketSnapshots, ">"), kv(events.BucketParked, ">"), kv(events.BucketHeartbeats, events.HeartbeatProbeKey)},
	}
	for _, r := range roles {
		if err := add(r.role, Account, append(r.publish, kvs[r.role]...)); err != nil {
			return nil, err
		}
	}
	for _, h := range hosts {
		if err := events.ValidName("host", h); err != nil {
			return nil, err
		}
		snap := events.SnapshotKeyAgent(h)
		if err := add(AgentRole(h), Account, append(authored(events.RoleAgent, ".host."+h, ".attempt."+h+".*"),
			kv(events.BucketHeartbeats, h), kv(events.BucketSnapshots, snap), kv(events.BucketSnapshots, events.SnapshotParts(snap)),
			kv(events.BucketParked, ">"))); err != nil {
			return nil, err
		}
		a.Users[len(a.Users)-1].API = agentAPI(h)
	}
	if err := add(RoleSystem, SystemAccount, nil); err != nil {
		return nil, err
	}
	return a, nil
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
				api := jsAPI
				if u.API != nil {
					api = u.API
				}
				fmt.Fprintf(&b, "        publish: {allow: [%s],\n", quoteAll(append(slicesClone(u.Publish), api...)))
				fmt.Fprintf(&b, "                  deny: [%s]}\n", quoteAll(jsDeny))
				b.WriteString("        subscribe: {allow: [\"_INBOX.>\"]}\n      }")
			}
			b.WriteString("}\n")
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "system_account: %s\n", SystemAccount)
	return b.String()
}

// jsAPI is what every Berth user publishes to use JetStream: the API
// (streams, consumers, KV buckets, direct gets), acks and flow control.
var jsAPI = []string{"$JS.API.>", "$JS.ACK.>", "$JS.FC.>"}

// agentAPI is the JetStream API an agent may call: consumers on the log
// only with its own host's filter (the server checks the filter in the
// create subject against the request), direct gets only of its own
// subjects, and the KV buckets it uses, its own snapshot only. So an agent
// reads nothing of other hosts' placements, jobs or bookings.
func agentAPI(host string) []string {
	const api, log = "$JS.API.", events.StreamName
	own := []string{events.HostAttemptsFilter(host), events.HostFilter(host)}
	out := []string{api + "INFO", api + "STREAM.INFO." + log, api + "STREAM.CREATE." + log, api + "STREAM.UPDATE." + log,
		api + "CONSUMER.INFO." + log + ".*", api + "CONSUMER.DELETE." + log + ".*", api + "CONSUMER.MSG.NEXT." + log + ".*",
		"$JS.ACK.>", "$JS.FC.>"}
	for _, s := range own {
		out = append(out, api+"CONSUMER.CREATE."+log+".*."+s, api+"DIRECT.GET."+log+"."+s)
	}
	// A KV bucket B is the stream KV_B; its key K is the subject $KV.B.K.
	for _, b := range []string{events.BucketHeartbeats, events.BucketParked, events.BucketSnapshots} {
		out = append(out, api+"STREAM.INFO.KV_"+b, api+"STREAM.CREATE.KV_"+b, api+"STREAM.UPDATE.KV_"+b)
	}
	snap := "KV_" + events.BucketSnapshots + ".$KV." + events.BucketSnapshots + "." + events.SnapshotKeyAgent(host)
	return append(out, api+"DIRECT.GET.KV_"+events.BucketHeartbeats+".>", api+"DIRECT.GET.KV_"+events.BucketParked+".>",
		api+"DIRECT.GET."+snap, api+"DIRECT.GET."+events.SnapshotParts(snap)) // a snapshot in parts
}

// jsDeny: no service deletes or purges the log (the stream denies it too).
var jsDeny = []string{"$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>"}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = `"` + s + `"`
	}
	return strings.Join(q, ", ")
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

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
