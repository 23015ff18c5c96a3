package events

import "log/slog"

// Plan is what a decide function returns: the facts to append and the
// calls to make, in the order they must happen (releases before bookings,
// law 2). Every step is keyed by a deterministic id, so acting on the same
// plan twice is harmless (law 9). The act shell (eventlog.Shell) executes
// it; a decide function builds it and does nothing else.
type Plan []Step

// Step is one thing a plan does: append Fact, or make Call (exactly one).
type Step struct {
	// Fact is appended; a ledger fact (see Ledger) with the ledger's
	// expected last sequence, so two writers never book one slot twice.
	Fact Payload
	// Call is a side effect the service runs off its loop (a GitHub call,
	// a backend step), bounded by a deadline, reporting back as a fact.
	Call Call
	// Key keeps the step from repeating while its fact is on its way back
	// to the fold; "" means the fact's event id. Facts whose ids carry a
	// time (a host lost, an alarm) use a key per condition instead.
	Key string
	// Then runs only when Fact was stored by this step (a booking's mint).
	Then []Step
	// Msg, when set, is logged at Level once Fact is stored, with Attrs.
	Msg   string
	Level slog.Level
	Attrs []any
}

// Call is a side effect a plan asks for. Kinds are the services' own
// (mint a JIT config, create a VM); CallKey identifies one, so a call
// still in flight is not started twice.
type Call interface {
	CallKey() string
}

// Ledgered is implemented by facts that are appended to a pool's slot
// ledger (berth.evt.pool.<pool>) with optimistic concurrency: the append
// names the ledger's last sequence the writer's fold has seen, and fails
// when anything else was appended since.
type Ledgered interface {
	Payload
	Ledger() string
}

// LedgerOf names the pool ledger p is appended to, if any.
func LedgerOf(p Payload) (string, bool) {
	if l, ok := p.(Ledgered); ok {
		return l.Ledger(), true
	}
	return "", false
}

// Fact is a step that appends p.
func Fact(p Payload) Step { return Step{Fact: p} }

// Do is a step that makes c.
func Do(c Call) Step { return Step{Call: c} }

// Add appends steps to the plan.
func (p *Plan) Add(s ...Step) { *p = append(*p, s...) }

// Facts lists the plan's facts of type T, in order, Then steps included:
// how tests read a plan ("then these facts").
func Facts[T Payload](p Plan) []T { return collect[T](p, func(s Step) any { return s.Fact }) }

// Calls lists the plan's calls of type T, in order, Then steps included.
func Calls[T Call](p Plan) []T { return collect[T](p, func(s Step) any { return s.Call }) }

func collect[T any](p Plan, part func(Step) any) []T {
	var out []T
	for _, s := range p {
		if v, ok := part(s).(T); ok {
			out = append(out, v)
		}
		out = append(out, collect[T](s.Then, part)...)
	}
	return out
}
