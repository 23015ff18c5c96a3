package ghsim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxJobsPerMessage is how many job messages one queue message carries at
// most, as on GitHub.
const MaxJobsPerMessage = 50

// DefaultReofferAfter is how long a job offered to a scale set may stay
// unacquired before the sim offers it again (JobAvailable), so a lost offer
// does not strand the job.
const DefaultReofferAfter = 30 * time.Second

const msgQueuePath = "/_msgqueue"

type ssSession struct {
	id, owner, token string
	expired          bool // the next queue call answers 401 until refreshed
}

type ssMessage struct {
	id        int
	jobs      []map[string]any
	notBefore time.Time // a delayed message is held until then
}

func (s *Sim) sessionRoutes(mux *http.ServeMux, svc func(name, pattern string, h http.HandlerFunc)) {
	svc(RouteSessions, "POST "+scaleSetsPath+"/{id}/sessions", s.handleCreateSession)
	svc(RouteSessions, "PATCH "+scaleSetsPath+"/{id}/sessions/{sid}", s.handleRefreshSession)
	svc(RouteSessions, "DELETE "+scaleSetsPath+"/{id}/sessions/{sid}", s.handleDeleteSession)
	svc(RouteAcquireJobs, "POST "+scaleSetsPath+"/{id}/acquirejobs", s.handleAcquireJobs)
	mux.Handle("GET "+msgQueuePath+"/{id}/{sid}", s.counted(RouteMessages, http.HandlerFunc(s.handleGetMessage)))
	mux.Handle("DELETE "+msgQueuePath+"/{id}/{sid}/{msg}", s.counted(RouteMessages, http.HandlerFunc(s.handleDeleteMessage)))
}

func (s *Sim) sessionByTokenLocked(tok string) *ssSession {
	for _, set := range s.sets {
		if ss := set.session; ss != nil && ss.token == tok && !ss.expired {
			return ss
		}
	}
	return nil
}

func (s *Sim) sessionJSONLocked(set *scaleSet, base string) map[string]any {
	ss := set.session
	return map[string]any{"sessionId": ss.id, "ownerName": ss.owner, "runnerScaleSet": s.setJSONLocked(set, base),
		"messageQueueUrl":         base + msgQueuePath + "/" + strconv.Itoa(set.id) + "/" + ss.id,
		"messageQueueAccessToken": ss.token, "statistics": s.statsLocked(set)}
}

// handleCreateSession opens the set's one message session: 200 with the
// queue's URL and token; 409 while another session is open. A new session
// is offered again every job still waiting to be acquired.
func (s *Sim) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var b struct {
		OwnerName string `json:"ownerName"`
	}
	_ = json.NewDecoder(r.Body).Decode(&b)
	base := s.baseURLFor(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.setOf(w, r)
	switch {
	case set == nil:
		return
	case set.session != nil:
		actionsError(w, http.StatusConflict, "TaskAgentSessionConflictException",
			"The actions runner scale set "+set.name+" has already an active session for owner "+set.session.owner+".")
		return
	}
	set.session = &ssSession{id: newUUID(), owner: b.OwnerName, token: "mq_" + randHex(16)}
	for _, j := range s.jobs {
		if j.set == set.id && j.setState == setAvailable && j.status == StatusQueued {
			s.pushLocked(set, "JobAvailable", j, nil)
		}
	}
	s.log.Info("scale set session opened", "set", set.id, "session", set.session.id, "owner", b.OwnerName)
	writeJSON(w, http.StatusOK, s.sessionJSONLocked(set, base))
}

// sessionOf finds the set's session named by {sid}; 404 otherwise.
func (s *Sim) sessionOf(w http.ResponseWriter, r *http.Request) *scaleSet {
	set := s.setOf(w, r)
	if set == nil {
		return nil
	}
	if set.session == nil || set.session.id != r.PathValue("sid") {
		actionsError(w, http.StatusNotFound, "TaskAgentSessionNotFoundException", "no session "+r.PathValue("sid")+": create a new one")
		return nil
	}
	return set
}

// handleRefreshSession gives the session a fresh queue token (what the
// client does on a 401 from the queue).
func (s *Sim) handleRefreshSession(w http.ResponseWriter, r *http.Request) {
	base := s.baseURLFor(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if set := s.sessionOf(w, r); set != nil {
		set.session.token, set.session.expired = "mq_"+randHex(16), false
		writeJSON(w, http.StatusOK, s.sessionJSONLocked(set, base))
	}
}

func (s *Sim) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if set := s.sessionOf(w, r); set != nil {
		set.session = nil
		s.notifyLocked()
		w.WriteHeader(http.StatusNoContent)
	}
}

// queueSet checks a queue call's path and bearer token against the set's
// live session; nil (after a 401) when the session is gone or its token is
// expired or not this session's.
func (s *Sim) queueSetLocked(r *http.Request) *scaleSet {
	id, _ := strconv.Atoi(r.PathValue("id"))
	set := s.sets[id]
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if set == nil || set.session == nil || set.session.id != r.PathValue("sid") || set.session.expired ||
		!strings.EqualFold(scheme, "Bearer") || tok != set.session.token {
		return nil
	}
	return set
}

// handleGetMessage long-polls the set's queue (Config.AcquireTimeout, then
// 202). It records X-ScaleSetMaxCapacity, lets GitHub assign acquired jobs
// within it (JobAssigned), and answers the first undeleted message after
// ?lastMessageId=, or a new one of at most MaxJobsPerMessage job messages.
// 401 when the session is gone or its token expired.
func (s *Sim) handleGetMessage(w http.ResponseWriter, r *http.Request) {
	last, _ := strconv.Atoi(r.URL.Query().Get("lastMessageId"))
	capacity, err := strconv.Atoi(r.Header.Get("X-ScaleSetMaxCapacity"))
	if err != nil || capacity < 0 {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "X-ScaleSetMaxCapacity must be a non-negative integer")
		return
	}
	code, body := s.pollQueue(r, last, capacity)
	switch code {
	case http.StatusOK:
		writeJSON(w, code, body)
	case http.StatusUnauthorized:
		actionsError(w, code, "VssUnauthorizedException", "message queue token expired or session gone: refresh the session")
	case http.StatusServiceUnavailable:
		simError(w, code, "simulator shutting down")
	default:
		w.WriteHeader(code)
	}
}

func (s *Sim) pollQueue(r *http.Request, last, capacity int) (int, map[string]any) {
	ctx := r.Context()
	timer := time.NewTimer(s.acquireTTL)
	defer timer.Stop()
	first := true
	s.mu.Lock()
	for {
		set := s.queueSetLocked(r)
		switch {
		case set == nil:
			s.mu.Unlock()
			return http.StatusUnauthorized, nil
		case s.closed:
			s.mu.Unlock()
			return http.StatusServiceUnavailable, nil
		case ctx.Err() != nil:
			s.mu.Unlock()
			return http.StatusRequestTimeout, nil
		}
		if first {
			set.capacity, first = capacity, false
			set.polls++
		}
		s.reofferLocked(set)
		s.assignWithinLocked(set)
		if m, wait := s.nextMessageLocked(set, last); m != nil {
			set.delivered++
			body, _ := json.Marshal(m.jobs)
			if m.jobs == nil {
				body = []byte("[]")
			}
			out := map[string]any{"messageId": m.id, "messageType": "RunnerScaleSetJobMessages",
				"body": string(body), "statistics": s.statsLocked(set)}
			s.mu.Unlock()
			return http.StatusOK, out
		} else if wait > 0 {
			time.AfterFunc(wait, s.wakeAll)
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return http.StatusRequestTimeout, nil
		case <-s.stop:
			return http.StatusServiceUnavailable, nil
		case <-timer.C:
			return http.StatusAccepted, nil
		}
		s.mu.Lock()
	}
}

func (s *Sim) wakeAll() {
	s.mu.Lock()
	s.notifyLocked()
	s.mu.Unlock()
}

// nextMessageLocked returns the first undeleted message after last, or
// builds one from the pending job messages (faults applied). A delayed
// message holds the queue: it returns nil and how long to wait.
func (s *Sim) nextMessageLocked(set *scaleSet, last int) (*ssMessage, time.Duration) {
	for _, m := range set.queue {
		if m.id <= last {
			continue
		}
		if wait := time.Until(m.notBefore); wait > 0 {
			return nil, wait
		}
		return m, 0
	}
	for len(set.pending) > 0 {
		n := min(len(set.pending), MaxJobsPerMessage)
		set.nextMsg++
		m := &ssMessage{id: set.nextMsg, jobs: set.pending[:n:n]}
		set.pending = set.pending[n:]
		if !s.applyFaultLocked(set, m) {
			continue // dropped: its job messages are lost
		}
		set.queue = append(set.queue, m)
		if wait := time.Until(m.notBefore); wait > 0 {
			return nil, wait
		}
		return m, 0
	}
	return nil, 0
}

// handleDeleteMessage acknowledges a message: it is not handed out again.
func (s *Sim) handleDeleteMessage(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.Atoi(r.PathValue("msg"))
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.queueSetLocked(r)
	if set == nil {
		actionsError(w, http.StatusUnauthorized, "VssUnauthorizedException", "message queue token expired or session gone: refresh the session")
		return
	}
	for i, m := range set.queue {
		if m.id == id {
			set.queue = append(set.queue[:i:i], set.queue[i+1:]...)
			break
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleAcquireJobs acquires the offered jobs among the runner request ids
// (the REST job ids) for the set and answers those acquired
// {"count","value"}; GitHub then assigns them within the set's capacity.
func (s *Sim) handleAcquireJobs(w http.ResponseWriter, r *http.Request) {
	var ids []int64
	if err := json.NewDecoder(r.Body).Decode(&ids); err != nil {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "acquirejobs takes a JSON array of runner request ids")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.setOf(w, r)
	if set == nil {
		return
	}
	got := []int64{}
	for _, id := range ids {
		if j := s.jobByID[id]; j != nil && j.set == set.id && j.setState == setAvailable && j.status == StatusQueued {
			j.setState = setAcquired
			got = append(got, id)
		}
	}
	s.assignWithinLocked(set)
	writeJSON(w, http.StatusOK, map[string]any{"count": len(got), "value": got})
}

// assignWithinLocked assigns acquired jobs to the set, oldest first, while
// the jobs assigned and not completed are fewer than the capacity it last
// polled with.
func (s *Sim) assignWithinLocked(set *scaleSet) {
	out := s.statsLocked(set).TotalAssigned
	for _, j := range s.jobs {
		if out >= set.capacity {
			return
		}
		if j.set == set.id && j.setState == setAcquired && j.status == StatusQueued {
			j.setState = setAssigned
			out++
			s.pushLocked(set, "JobAssigned", j, nil)
		}
	}
}

// reofferLocked offers again jobs left unacquired for ReofferAfter.
func (s *Sim) reofferLocked(set *scaleSet) {
	after := s.cfg.ReofferAfter
	if after <= 0 {
		after = DefaultReofferAfter
	}
	now := time.Now()
	for _, j := range s.jobs {
		if j.set == set.id && j.setState == setAvailable && j.status == StatusQueued && now.Sub(j.offeredAt) >= after {
			s.pushLocked(set, "JobAvailable", j, nil)
		}
	}
}

// ssStats is the queue's statistics object.
type ssStats struct {
	TotalAvailable  int `json:"totalAvailableJobs"`
	TotalAcquired   int `json:"totalAcquiredJobs"`
	TotalAssigned   int `json:"totalAssignedJobs"`
	TotalRunning    int `json:"totalRunningJobs"`
	TotalRegistered int `json:"totalRegisteredRunners"`
	TotalBusy       int `json:"totalBusyRunners"`
	TotalIdle       int `json:"totalIdleRunners"`
}

func (s *Sim) statsLocked(set *scaleSet) ssStats {
	var st ssStats
	for _, j := range s.jobs {
		if j.set != set.id || j.status == StatusCompleted {
			continue
		}
		switch {
		case j.setState == setAvailable:
			st.TotalAvailable++
		case j.setState == setAcquired:
			st.TotalAcquired++
		case j.setState == setAssigned:
			st.TotalAssigned++
			if j.status == StatusInProgress {
				st.TotalRunning++
			}
		}
	}
	for _, rn := range s.runners {
		if rn.set == set.id {
			st.TotalRegistered++
			if rn.busy() {
				st.TotalBusy++
			}
		}
	}
	st.TotalIdle = st.TotalRegistered - st.TotalBusy
	return st
}

// pushLocked queues one job message for the set's next queue message.
func (s *Sim) pushLocked(set *scaleSet, typ string, j *job, rn *runner) {
	m := map[string]any{"messageType": typ, "runnerRequestId": j.id, "repositoryName": s.cfg.Repo,
		"ownerName": s.cfg.Org, "jobId": strconv.FormatInt(j.id, 10),
		"jobWorkflowRef": s.cfg.Org + "/" + s.cfg.Repo + "/.github/workflows/ci.yml@refs/heads/main",
		"jobDisplayName": j.name, "workflowRunId": j.runID, "eventName": "push", "requestLabels": j.labels,
		"queueTime": j.queuedAt}
	switch typ {
	case "JobAvailable":
		j.offeredAt = time.Now()
		m["acquireJobUrl"] = scaleSetsPath + "/" + strconv.Itoa(set.id) + "/acquirejobs"
	case "JobStarted", "JobCompleted":
		m["runnerId"], m["runnerName"], m["runnerAssignTime"] = rn.id, rn.name, j.startedAt
	}
	if typ == "JobCompleted" {
		m["result"], m["finishTime"] = resultOf(j.conclusion), j.completedAt
	}
	set.pending = append(set.pending, m)
	s.notifyLocked()
}

// resultOf is the scale set's word for a conclusion.
func resultOf(conclusion string) string {
	switch conclusion {
	case ConclusionSuccess:
		return "succeeded"
	case ConclusionFailure:
		return "failed"
	}
	return "canceled"
}

// setEventLocked tells j's scale set, if any, that a runner took or
// finished the job (JobStarted, JobCompleted).
func (s *Sim) setEventLocked(j *job, typ string, rn *runner) {
	if set := s.sets[j.set]; set != nil && (j.setState == setAssigned || typ == "JobCompleted") {
		if rn == nil {
			rn = &runner{}
		}
		s.pushLocked(set, typ, j, rn)
	}
}

// mayTakeLocked: a runner of a scale set takes any job assigned to its
// set; any other runner takes jobs no set holds whose labels it has.
func mayTake(r *runner, j *job) bool {
	if r.set != 0 {
		return j.set == r.set && j.setState == setAssigned
	}
	return j.set == 0 && labelsMatch(j.labels, r.labels)
}
