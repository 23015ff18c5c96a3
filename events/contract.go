package events

import (
	"strconv"
	"time"
)

// This file is Berth's contract with everything outside one process: the
// names and shapes that cross a process boundary. Operators type them
// (`nats stream info`, `nats kv get`), NATS permissions grant them
// (services/natsauth, deploy/nats), dashboards and alerts query them
// (deploy/grafana, docs/runbooks.md), and the README and tests name them.
// Each value is external: change one only on purpose, with its readers.
// contract_test.go pins every value, and fails when production code spells
// one of them as a literal anywhere but here.
//
// It lives in package events because every service and tool imports that
// package and it has no I/O, so a non-Go reader of the log can follow it
// too.

// The log. Writers: every service, through eventlog.Appender (each role
// only on its own subjects, services/natsauth). Readers: every service's
// consumer, `berth tail`, `berth replay`, `nats`.
const (
	// StreamName is the JetStream stream holding the whole event log.
	StreamName = "BERTH_EVENTS"
	// SubjectPrefix starts every fact's subject; subjects.go builds the
	// per-aggregate subjects under it.
	SubjectPrefix = "berth.evt"
	// SubjectAll matches every fact: the stream's subject filter.
	SubjectAll = SubjectPrefix + ".>"
)

// KV buckets. None of them holds a fact: each is a shortcut or a side
// record that the log could rebuild or does without.
const (
	// BucketSnapshots holds fold snapshots, one key per reader (see the
	// SnapshotKey* names), a large one split into parts (SnapshotPartKey).
	// Writers: each service's eventlog.Loop, for its own key. Readers: the
	// same loop on restart; `berth replay` and `berth status` read the
	// whole-log ones (dispatcher, watchdog) once old facts have expired.
	// A snapshot is only a shortcut: deleting the bucket just makes the
	// next start replay the whole log.
	BucketSnapshots = "berth_snapshots"
	// BucketHeartbeats holds one Heartbeat per host (key: host name) and
	// the watchdog's HeartbeatProbeKey. Writers: each vmagent, its own key;
	// the watchdog, its probe. Readers: the watchdog (host liveness),
	// `berth status` (last heartbeat).
	BucketHeartbeats = "berth_heartbeats"
	// BucketParked holds poison-fact records, key ParkedKey(reader, seq).
	// Writer: any service's eventlog.Loop that parks a fact. Readers:
	// operators (`nats kv ls berth_parked`).
	BucketParked = "berth_parked"
	// BucketTrust holds the keys the fleet trusts, one per key (see
	// TrustKeyDispatcher). Writer: the admin only (`berth stream apply`
	// creates it, `berth trust add` writes it; `berth dev` trusts its own
	// dispatcher). Readers: every agent, before it opens a sealed JIT
	// config.
	BucketTrust = "berth_trust"
	// BucketScaleSets holds each runner scale set's lease, message
	// session and last message id (key: scale set name); the dispatcher
	// writes it (services/setintake).
	BucketScaleSets = "berth_scalesets"
)

// TrustKeyDispatcher is the key in BucketTrust that trusts a dispatcher's
// curve public key (the key its placements are sealed by):
// "dispatcher.<public key>"; the value says whose it is.
func TrustKeyDispatcher(pub string) string { return "dispatcher." + pub }

// Snapshot keys in BucketSnapshots. The dispatcher's and the watchdog's
// fold the whole log; an agent's folds only its host's subjects.
const (
	SnapshotKeyDispatcher = "dispatcher"
	SnapshotKeyWatchdog   = "watchdog"
)

// SnapshotKeyAgent is the snapshot key of host's vmagent: "agent-<host>".
// NATS permissions confine an agent to this key and its parts.
func SnapshotKeyAgent(host string) string { return "agent-" + host }

// SnapshotPartKey is the key of part i of the snapshot stored under key
// that covers stream sequence gen: "<key>.g<gen>.<i>". A snapshot too large
// for one message is stored in parts, with a manifest under key itself
// (services/eventlog/snapstore.go).
func SnapshotPartKey(key string, gen uint64, i int) string {
	return key + ".g" + strconv.FormatUint(gen, 10) + "." + strconv.Itoa(i)
}

// SnapshotParts is the KV key wildcard matching every part of the snapshot
// stored under key: "<key>.>".
func SnapshotParts(key string) string { return key + ".>" }

// ParkedKey is the key in BucketParked of the fact at stream sequence seq
// that reader (a consumer name or snapshot key) parked: "<reader>.<seq>".
func ParkedKey(reader string, seq uint64) string {
	return reader + "." + strconv.FormatUint(seq, 10)
}

// HeartbeatProbeKey is the key in BucketHeartbeats the watchdog writes to
// learn whether the bucket takes writes. No host is named so: host names
// hold no dot (ValidName).
const HeartbeatProbeKey = "watchdog.probe"

// Heartbeat is one agent's liveness record: the JSON value stored in
// BucketHeartbeats under the host's name. Heartbeats are not facts: they
// would flood the log. Writer: the host's vmagent, every heartbeat interval
// (5 s by default), each time a new revision of its key. Readers: the
// watchdog, which judges a host lost when it has seen no new revision for
// the host TTL on its own clock (At is never compared with its clock for
// that; it only reports At minus its clock as the host's clock skew), and
// `berth status`, which shows At as the host's last heartbeat.
type Heartbeat struct {
	Host    string    `json:"host"`
	Boot    string    `json:"boot"` // changes on every agent start
	At      time.Time `json:"at"`
	LiveVMs int       `json:"live_vms"`
}

// Prometheus metric names. Readers of all of them: Prometheus scraping each
// service's /metrics, deploy/grafana/berth.json, the alerts and runbooks in
// docs/, and the e2e, chaos and scenario tests.

// Pool slot gauges, written by both the dispatcher (services/dispatch) and
// the watchdog (services/watchdog) from their own folds, each on its own
// /metrics.
const (
	MetricPoolSlotsHeld     = "berth_pool_slots_held"
	MetricPoolSlotsCapacity = "berth_pool_slots_capacity"
)

// Dispatcher metrics. Writer: services/dispatch (metrics.go).
const (
	MetricWebhooksTotal            = "berth_webhooks_total"
	MetricEventsSkippedTotal       = "berth_events_skipped_total"
	MetricPoolJobsQueued           = "berth_pool_jobs_queued"
	MetricJITMintSeconds           = "berth_jit_mint_seconds"
	MetricGitHubAPIRemaining       = "berth_github_api_remaining"
	MetricGitHubAPIBlockedSeconds  = "berth_github_api_blocked_seconds"
	MetricJobConflictsTotal        = "berth_job_conflicts_total"
	MetricJobQueueSeconds          = "berth_job_queue_seconds"
	MetricRunnerOnlineSeconds      = "berth_runner_online_seconds"
	MetricPoolWarmVMs              = "berth_pool_warm_vms"
	MetricPoolWarmTarget           = "berth_pool_warm_target"
	MetricPoolWarmRefillLagSeconds = "berth_pool_warm_refill_lag_seconds"
	// MetricRunnersSweptTotal: Berth-named runner registrations the
	// runner sweep deleted because no live attempt accounted for them.
	MetricRunnersSweptTotal = "berth_runners_swept_total"
)

// Watchdog fleet gauges. Writer: services/watchdog (metrics.go).
const (
	MetricPoolAttemptsRunning      = "berth_pool_attempts_running"
	MetricPoolAttemptsProvisioning = "berth_pool_attempts_provisioning"
	MetricPoolJobsWaitingForSlot   = "berth_pool_jobs_waiting_for_slot"
	MetricPoolAbandonedVMs         = "berth_pool_abandoned_vms"
	MetricPoolAlarmsActive         = "berth_pool_alarms_active"
	MetricHostLiveVMs              = "berth_host_live_vms"
	MetricHostAbandonedVMs         = "berth_host_abandoned_vms"
	MetricHostPhysicalCap          = "berth_host_physical_cap"
	MetricHostCordoned             = "berth_host_cordoned"
	// MetricHostClockSkewSeconds: a host agent's clock minus the
	// watchdog's, seen when its heartbeat changes; negative when the agent
	// is behind. Reported, never acted on (law 10).
	MetricHostClockSkewSeconds = "berth_host_clock_skew_seconds"
)

// Event log consumer metrics, one set per service (dispatcher, watchdog,
// each agent). Writer: services/run (loopMetrics), from eventlog.Loop.
const (
	MetricLogRedeliveredTotal       = "berth_log_redelivered_total"
	MetricLogConsumerRecreatedTotal = "berth_log_consumer_recreated_total"
	MetricLogReactionPanicsTotal    = "berth_log_reaction_panics_total"
	MetricLogConsumerPending        = "berth_log_consumer_pending"
	MetricLogParkedTotal            = "berth_log_parked_total"
	MetricLogRefusedTotal           = "berth_log_refused_total"
	// MetricLogDuplicateMismatchTotal: duplicate answers whose stored
	// fact, read back, was not the writer's own (another fact held its
	// id); each was appended again under a fresh id (issue 17).
	MetricLogDuplicateMismatchTotal = "berth_log_duplicate_mismatch_total"
)

// MetricAgentBackendStepSeconds: each agent's backend calls (step create,
// assign or stop; outcome ok, failed, deadline, canceled or unsupported),
// a histogram, so its _count is the calls. Writer: services/run
// (measured), around the backend.
const MetricAgentBackendStepSeconds = "berth_agent_backend_step_seconds"
