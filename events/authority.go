package events

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Role is who may author a fact (law 10). A role is also the last token of
// the subject of every fact on an aggregate that several roles write (a
// pool's ledger, an attempt, a host), so the server's publish permissions
// (services/natsauth) decide who can store what, and a reader confirms the
// author from where the fact is stored, never from what it says.
type Role string

// The roles. An agent's role is RoleAgent on its own host's subjects only
// (berth.evt.host.<host>.agent, berth.evt.attempt.<host>.<attempt>.agent).
const (
	RoleDispatcher Role = "dispatcher"
	RoleWatchdog   Role = "watchdog"
	RoleAgent      Role = "agent"
	RoleCLI        Role = "cli"
)

// Roles lists every role.
var Roles = []Role{RoleDispatcher, RoleWatchdog, RoleAgent, RoleCLI, RoleAdmin}

// authors names, per fact type, the roles that may write it. One place, so
// the catalogue says who speaks for each fact; a test holds every type to
// having an entry.
var authors = map[string][]Role{
	TypeJobQueued:        {RoleDispatcher},
	TypeJobWaiting:       {RoleDispatcher},
	TypeJobInProgress:    {RoleDispatcher},
	TypeJobCompleted:     {RoleDispatcher},
	TypeJobUnschedulable: {RoleDispatcher},
	TypeJobConflict:      {RoleDispatcher},

	TypeSlotReserved:   {RoleDispatcher},
	TypeSlotReleased:   {RoleDispatcher, RoleWatchdog, RoleCLI}, // demand ended; a deadline; `berth release`
	TypeAttemptClaimed: {RoleDispatcher},

	TypeAttemptPlaced:            {RoleDispatcher},
	TypeAttemptAssigned:          {RoleDispatcher},
	TypeAttemptDeregistered:      {RoleDispatcher},
	TypeAttemptBound:             {RoleDispatcher},
	TypeAttemptRunnerBusy:        {RoleDispatcher},
	TypeAttemptTeardownRequested: {RoleDispatcher, RoleWatchdog, RoleCLI},
	TypeAttemptProvisioning:      {RoleAgent},
	TypeAttemptRunnerStarted:     {RoleAgent},
	TypeAttemptFailed:            {RoleAgent},
	TypeAttemptStopped:           {RoleAgent},
	TypeAttemptReady:             {RoleAgent},
	TypeAttemptRunnerVersion:     {RoleAgent},
	TypeAttemptRunnerRefused:     {RoleAgent},
	TypeAttemptAbandoned:         {RoleAgent, RoleWatchdog}, // a step overran; a teardown deadline passed

	TypeHostOnline:     {RoleAgent},
	TypeHostDraining:   {RoleAgent, RoleCLI}, // SIGTERM; `berth drain`
	TypeHostLost:       {RoleWatchdog},
	TypeHostCordoned:   {RoleWatchdog, RoleCLI},
	TypeHostUncordoned: {RoleWatchdog, RoleCLI},
	TypeHostDegraded:   {RoleWatchdog},
	TypeHostRecovered:  {RoleWatchdog},
	TypeHostGranted:    {RoleAdmin}, // `berth trust host`, `berth stream apply --grant-agents`

	TypeDemandWaiting: {RoleWatchdog},
	TypeAlarmRaised:   {RoleWatchdog},
	TypeAlarmCleared:  {RoleWatchdog},
}

// Authors lists the roles that may write facts of type typ (nil: unknown).
func Authors(typ string) []Role { return authors[typ] }

// multiAuthor reports whether facts on base (a payload's EventSubject) are
// stored under a role token: the aggregates that several roles write.
func multiAuthor(base string) bool {
	for _, kind := range []string{".pool.", ".attempt.", ".host."} {
		if strings.HasPrefix(base, SubjectPrefix+kind) {
			return true
		}
	}
	return false
}

// SubjectBy is the subject a fact p written by role is stored under: its
// aggregate's subject, plus the role's token where several roles write
// the aggregate.
func SubjectBy(p Payload, role Role) string {
	base := p.EventSubject()
	if multiAuthor(base) && role != "" {
		return base + "." + string(role)
	}
	return base
}

// AggregateFilter matches every fact of the aggregate whose fact is stored
// on subject, whoever wrote it: the filter of an optimistic-concurrency
// check on an aggregate that several roles write (NATS'
// Nats-Expected-Last-Subject-Sequence-Subject). For other subjects it is
// the subject itself.
func AggregateFilter(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i > 0 && multiAuthor(subject[:i]) {
		return subject[:i] + ".*"
	}
	return subject
}

// ErrForged marks a fact whose stored subject does not confirm its payload
// or its author: stored where its payload does not stand, or written by a
// role the catalogue does not allow for its type. A reader counts, parks and
// alarms on it, and never folds it.
var ErrForged = errors.New("fact refused: its subject does not confirm it")

// Authorize confirms a decoded fact from where it is stored: the stored
// subject must be the subject its payload implies (so every pool, host,
// job and attempt id it names is confirmed by the subject the server let
// its author write), and end in a role allowed to write its type. It
// returns that role, or an error wrapping ErrForged that says why.
func Authorize(e Event) (Role, error) {
	if e.Data == nil {
		return "", fmt.Errorf("%w: no payload", ErrForged)
	}
	typ := e.Data.EventType()
	allowed := authors[typ]
	base := e.Data.EventSubject()
	if !multiAuthor(base) {
		if e.Subject != base {
			return "", fmt.Errorf("%w: %s stored on %s, its payload stands on %s", ErrForged, typ, e.Subject, base)
		}
		return allowed[0], nil
	}
	token, ok := strings.CutPrefix(e.Subject, base+".")
	if !ok || strings.Contains(token, ".") {
		return "", fmt.Errorf("%w: %s stored on %s, its payload stands on %s.<role>", ErrForged, typ, e.Subject, base)
	}
	if role := Role(token); slices.Contains(allowed, role) {
		return role, nil
	}
	return "", fmt.Errorf("%w: %s written as %q, which may not write it (allowed: %v)", ErrForged, typ, token, allowed)
}

// AuthorOf is the role a stored subject names as its fact's author: its
// last token on an aggregate several roles write, "" elsewhere (a single
// author's subject names none; Authors gives it).
func AuthorOf(subject string) Role {
	if i := strings.LastIndexByte(subject, '.'); i > 0 && multiAuthor(subject[:i]) {
		return Role(subject[i+1:])
	}
	return ""
}

// Admit is Authorize and what the fold f must confirm besides (law 10): a
// fact on an attempt's subject speaks only for an attempt booked or placed
// on the host its subject names. The subject confirms a host and an
// attempt id, but attempts are keyed by id: without this, an agent could
// write, on its own subject, a failure or a stop of another host's attempt
// (the same id with its own host) and have its slot released and its VM
// forgotten. So an attempt fact is refused when the fold holds the attempt
// on another host, and, unless the dispatcher (which books and places)
// wrote it, when no booking or placement of the attempt is in the fold:
// an agent cannot claim a future attempt id before it is booked. Services
// and replays admit with their own fold, in log order, so they agree.
func Admit(f *Fleet, e Event) (Role, error) {
	role, err := Authorize(e)
	if err != nil || f == nil {
		return role, err
	}
	host, id, ok := attemptOf(e.Data.EventSubject())
	if !ok {
		return role, nil
	}
	a := f.Attempts[id]
	switch {
	case a == nil && f.SettledAttempt(id):
		// Over and settled into its id: a late fact about it is absorbed
		// by the fold (history.go), not refused as a forgery.
	case a != nil && a.Host != "" && a.Host != host:
		return "", fmt.Errorf("%w: %s about attempt %s on %s's subject, but the attempt is on host %s", ErrForged, e.Data.EventType(), id, host, a.Host)
	case role != RoleDispatcher && (a == nil || !(a.Reserved || a.Placed)):
		return "", fmt.Errorf("%w: %s about attempt %s, which no booking or placement in the log names", ErrForged, e.Data.EventType(), id)
	}
	return role, nil
}

// attemptOf is the host and attempt id of an attempt's subject
// (AttemptSubject).
func attemptOf(subject string) (host, attempt string, ok bool) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".attempt.")
	if !ok {
		return "", "", false
	}
	host, attempt, ok = strings.Cut(rest, ".")
	return host, attempt, ok && !strings.Contains(attempt, ".")
}
