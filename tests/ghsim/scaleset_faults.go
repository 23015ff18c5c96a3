package ghsim

import "time"

// MessageFault is what the sim does with a scale-set queue message as it
// is built: the failures listeners report from GitHub.
type MessageFault int

const (
	// Deliver hands the message out as built.
	Deliver MessageFault = iota
	// Drop loses the message: its id is used and its job messages vanish.
	Drop
	// Duplicate hands the message out and its job messages again in a
	// later message.
	Duplicate
	// Empty hands the message out with its statistics but an empty body.
	Empty
	// Delay holds the message (and the queue behind it) for the duration.
	Delay
)

// MessageView describes a message being built, for a MessageFaults rule.
type MessageView struct {
	SetID, ID int
	Types     []string // messageType of each job message, in order
}

// MessageFaults sets the rule deciding each new queue message's fault
// (and, for Delay, how long); nil delivers every message.
func (s *Sim) MessageFaults(rule func(MessageView) (MessageFault, time.Duration)) {
	s.mu.Lock()
	s.msgFault = rule
	s.mu.Unlock()
}

// applyFaultLocked applies the rule to message m; false: drop it.
func (s *Sim) applyFaultLocked(set *scaleSet, m *ssMessage) bool {
	if s.msgFault == nil {
		return true
	}
	v := MessageView{SetID: set.id, ID: m.id}
	for _, j := range m.jobs {
		v.Types = append(v.Types, j["messageType"].(string))
	}
	f, d := s.msgFault(v)
	switch f {
	case Drop:
		s.log.Info("scale set message dropped", "set", set.id, "message", m.id, "jobs", v.Types)
		return false
	case Duplicate:
		set.pending = append(set.pending, m.jobs...)
	case Empty:
		m.jobs = nil
	case Delay:
		m.notBefore = time.Now().Add(d)
	}
	return true
}

// EvictSessions ends every scale set's message session, as GitHub does to
// a session it deems gone: the holder's next queue call answers 401 and
// its refresh 404, so it must open a new session. It returns how many
// sessions it ended.
func (s *Sim) EvictSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, set := range s.sets {
		if set.session != nil {
			set.session = nil
			n++
		}
	}
	s.notifyLocked()
	return n
}

// ExpireSessionTokens expires every session's queue token: the next queue
// call answers 401 and the client refreshes the session (PATCH) in place.
func (s *Sim) ExpireSessionTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, set := range s.sets {
		if set.session != nil {
			set.session.expired = true
		}
	}
	s.notifyLocked()
}
