package events

import (
	"fmt"
	"regexp"
	"strconv"
)

// Subject scheme, under SubjectPrefix (contract.go). Every aggregate
// instance has its own subject, so optimistic concurrency works per
// aggregate (Nats-Expected-Last-Subject-Sequence) and an operator can slice
// the log with `nats sub` or `nats stream subjects`:
//
//	berth.evt.job.<job id>                        job facts from GitHub webhooks, job unschedulable
//	berth.evt.pool.<pool>.<role>                  the pool's slot ledger: slot reserved / released
//	berth.evt.attempt.<host>.<attempt id>.<role>  one placement's lifecycle on one host
//	berth.evt.host.<host>.<role>                  host online / draining / lost / cordoned / uncordoned
//	berth.evt.demand.<pool>                       demand waiting for a slot
//	berth.evt.alarm.<pool>                        alarms raised / cleared, scoped to a pool
//
// An aggregate that several roles write (a pool's ledger, an attempt, a
// host) ends in its author's role (authority.go): the server lets each role
// publish only under its own token, and a reader confirms the author from
// the subject. The functions below give an aggregate's subject without the
// token; SubjectBy adds it, and the *Filter functions match every author.

// JobSubject is the subject of a GitHub job's facts.
func JobSubject(jobID int64) string {
	return SubjectPrefix + ".job." + strconv.FormatInt(jobID, 10)
}

// PoolSubject is the subject of a pool's slot ledger.
func PoolSubject(pool string) string { return SubjectPrefix + ".pool." + pool }

// AttemptSubject is the subject of one attempt on one host.
func AttemptSubject(host, attempt string) string {
	return SubjectPrefix + ".attempt." + host + "." + attempt
}

// PoolFilter matches a pool's ledger, every author's facts.
func PoolFilter(pool string) string { return PoolSubject(pool) + ".*" }

// AttemptFilter matches one attempt's facts, every author's.
func AttemptFilter(host, attempt string) string { return AttemptSubject(host, attempt) + ".*" }

// HostFilter matches a host's own facts, every author's.
func HostFilter(host string) string { return HostSubject(host) + ".*" }

// HostAttemptsFilter matches every attempt placed on host: the agent's filter.
func HostAttemptsFilter(host string) string { return SubjectPrefix + ".attempt." + host + ".>" }

// HostSubject is the subject of a host's facts.
func HostSubject(host string) string { return SubjectPrefix + ".host." + host }

// DemandSubject is the subject of a pool's waiting-demand reports.
func DemandSubject(pool string) string { return SubjectPrefix + ".demand." + pool }

// AlarmSubject is the subject of alarms scoped to a pool (or "fleet").
func AlarmSubject(scope string) string { return SubjectPrefix + ".alarm." + scope }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidName reports whether s can be a pool or host name: 1 to 64 of
// [A-Za-z0-9_-], so that it is a single NATS subject token.
func ValidName(kind, s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("%s name %q: use 1 to 64 letters, digits, '-' or '_' (it becomes a NATS subject token)", kind, s)
	}
	return nil
}

// AttemptID names the n-th placement made for a job: "berth-<job id>-<n>".
// It is deterministic, so a dispatcher that crashes after booking and retries
// reuses the same id (and the server deduplicates the booking), and it is the
// runner name, the VM name and the key of every resource the attempt owns.
func AttemptID(jobID int64, n int) string {
	return "berth-" + strconv.FormatInt(jobID, 10) + "-" + strconv.Itoa(n)
}

var attemptRE = regexp.MustCompile(`^berth-([0-9]+|warm-[A-Za-z0-9_-]{1,64})-[0-9]+$`)

// IsAttemptID reports whether s has the shape AttemptID makes. An inventory
// sweep only ever touches VMs whose names have it: anything else on a host
// is not Berth's to stop.
func IsAttemptID(s string) bool { return attemptRE.MatchString(s) }

// Consumer names on the log (StreamName). Each is exact and owned by one
// role, so that NATS permissions can grant a role its own consumers by name
// and nothing else (a permission's wildcard matches a whole subject token,
// and a consumer name is one token: no prefix can be granted). The kinds
// start with different letters after "berth-", so no host or instance name
// makes one role's name equal another's.

// ServiceConsumer is the durable consumer of a dispatcher or watchdog
// replica: "berth-<service>-<instance>" (service "dispatcher" or
// "watchdog"; instance a ValidName, see config's instance).
func ServiceConsumer(service, instance string) string { return "berth-" + service + "-" + instance }

// AgentConsumer is the durable consumer of host's agent, on
// HostAttemptsFilter(host): "berth-agent-<host>".
func AgentConsumer(host string) string { return "berth-agent-" + host }

// HostWatchConsumer is the consumer with which host's agent follows its
// host's own facts (HostFilter): "berth-hostwatch-<host>".
func HostWatchConsumer(host string) string { return "berth-hostwatch-" + host }
