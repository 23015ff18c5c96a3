package ghsim

// The runner scale set side of the simulator: the registration handshake,
// runner groups, scale sets and the runners they mint. The message sessions
// and their queue are in scaleset_queue.go, the faults in
// scaleset_faults.go. Paths, bodies and headers are those the real client,
// github.com/actions/scaleset v0.4.0, sends and reads.
//
// A job enters a scale set when its labels are all among the set's labels
// (case-insensitive): the same job the REST API lists, with the scale set's
// runner request id equal to the REST job id, so both views name it alike.
// A scale-set job goes only to the set's own runners, and any idle runner of
// the set takes any job the set was assigned, as on GitHub.

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ActionsPrefix is where the sim serves the actions service: the url the
// registration handshake returns is the sim's base URL plus this.
const ActionsPrefix = "/_actions"

// Scale-set route names counted by APICalls.
const (
	RouteRegistrationToken  = "registration-token"   // POST /api/v3/{orgs/{org}|repos/{o}/{r}}/actions/runners/registration-token
	RouteRunnerRegistration = "runner-registration"  // POST /api/v3/actions/runner-registration
	RouteRunnerGroups       = "ss-runner-groups"     // GET _apis/runtime/runnergroups/
	RouteScaleSets          = "ss-scale-sets"        // GET/POST/PATCH/DELETE _apis/runtime/runnerscalesets[/{id}]
	RouteSessions           = "ss-sessions"          // POST/PATCH/DELETE …/{id}/sessions[/{sid}]
	RouteMessages           = "ss-messages"          // GET/DELETE the message queue
	RouteAcquireJobs        = "ss-acquirejobs"       // POST …/{id}/acquirejobs
	RouteScaleSetJIT        = "ss-generatejitconfig" // POST …/{id}/generatejitconfig
	RouteAgents             = "ss-agents"            // GET/DELETE _apis/distributedtask/pools/0/agents[/{id}]
	adminTokenTTL           = time.Hour              // the actions service admin token's life
	scaleSetsPath           = ActionsPrefix + "/_apis/runtime/runnerscalesets"
	agentsPath              = ActionsPrefix + "/_apis/distributedtask/pools/0/agents"
)

// The states a scale-set job passes through before a runner takes it.
const (
	setAvailable = iota + 1 // offered to the set (JobAvailable)
	setAcquired             // the listener acquired it (acquirejobs)
	setAssigned             // GitHub assigned it to the set, within capacity (JobAssigned)
)

type scaleSet struct {
	id, groupID int
	name        string
	labels      []string
	createdOn   time.Time
	session     *ssSession
	pending     []map[string]any // job messages not yet put in a queue message
	queue       []*ssMessage     // messages handed out and not deleted, by id
	nextMsg     int
	capacity    int // the last X-ScaleSetMaxCapacity polled with
	polls       int
	delivered   int // messages answered with 200
}

// ScaleSetView is a snapshot of one scale set.
type ScaleSetView struct {
	ID, RunnerGroupID int
	Name              string
	Labels            []string
	SessionID         string // "" without a session
	SessionOwner      string
	Capacity          int // the last X-ScaleSetMaxCapacity sent
	Polls, Delivered  int // message polls, and those answered with a message
	Stats             map[string]int
}

// ScaleSets returns a snapshot of the scale sets, by id.
func (s *Sim) ScaleSets() []ScaleSetView {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ScaleSetView
	for _, set := range s.sortedSetsLocked() {
		v := ScaleSetView{ID: set.id, RunnerGroupID: set.groupID, Name: set.name, Labels: slices.Clone(set.labels),
			Capacity: set.capacity, Polls: set.polls, Delivered: set.delivered}
		if set.session != nil {
			v.SessionID, v.SessionOwner = set.session.id, set.session.owner
		}
		st := s.statsLocked(set)
		v.Stats = map[string]int{}
		b, _ := json.Marshal(st)
		_ = json.Unmarshal(b, &v.Stats)
		out = append(out, v)
	}
	return out
}

func (s *Sim) sortedSetsLocked() []*scaleSet {
	out := make([]*scaleSet, 0, len(s.sets))
	for _, set := range s.sets {
		out = append(out, set)
	}
	slices.SortFunc(out, func(a, b *scaleSet) int { return a.id - b.id })
	return out
}

func (s *Sim) scaleSetRoutes(mux *http.ServeMux) {
	gh := func(name, pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, s.counted(name, s.authed(h)))
	}
	// Under /api/v3, where the scaleset client looks on a server that is
	// not github.com, and at the root, where the REST routes are (go-github
	// pointed at the sim: a GitHub App's installation client).
	for _, prefix := range []string{"/api/v3", ""} {
		gh(RouteRegistrationToken, "POST "+prefix+"/orgs/{org}/actions/runners/registration-token", s.handleRegistrationToken)
		gh(RouteRegistrationToken, "POST "+prefix+"/repos/{owner}/{repo}/actions/runners/registration-token", s.handleRegistrationToken)
	}
	gh(RouteInstallationToken, "POST /api/v3/app/installations/{installation_id}/access_tokens", s.handleInstallationToken)
	mux.Handle("POST /api/v3/actions/runner-registration", s.counted(RouteRunnerRegistration, http.HandlerFunc(s.handleRunnerRegistration)))
	svc := func(name, pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, s.counted(name, s.actionsAuthed(h)))
	}
	svc(RouteRunnerGroups, "GET "+ActionsPrefix+"/_apis/runtime/runnergroups/{$}", s.handleRunnerGroups)
	svc(RouteRunnerGroups, "GET "+ActionsPrefix+"/_apis/runtime/runnergroups", s.handleRunnerGroups)
	svc(RouteScaleSets, "GET "+scaleSetsPath, s.handleListScaleSets)
	svc(RouteScaleSets, "POST "+scaleSetsPath, s.handleCreateScaleSet)
	svc(RouteScaleSets, "GET "+scaleSetsPath+"/{id}", s.handleGetScaleSet)
	svc(RouteScaleSets, "PATCH "+scaleSetsPath+"/{id}", s.handleUpdateScaleSet)
	svc(RouteScaleSets, "DELETE "+scaleSetsPath+"/{id}", s.handleDeleteScaleSet)
	svc(RouteScaleSetJIT, "POST "+scaleSetsPath+"/{id}/generatejitconfig", s.handleScaleSetJIT)
	svc(RouteAgents, "GET "+agentsPath, s.handleListAgents)
	svc(RouteAgents, "GET "+agentsPath+"/{id}", s.handleGetAgent)
	svc(RouteAgents, "DELETE "+agentsPath+"/{id}", s.handleDeleteAgent)
	s.sessionRoutes(mux, svc)
}

// handleRegistrationToken mimics "Create a registration token for an
// organization / a repository": 201 {"token","expires_at"} (one hour).
func (s *Sim) handleRegistrationToken(w http.ResponseWriter, r *http.Request) {
	tok := "A" + strings.ToUpper(randHex(14))
	s.mu.Lock()
	s.regTokens[tok] = true
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{"token": tok, "expires_at": ghTime(time.Now().Add(time.Hour))})
}

// handleRunnerRegistration is the handshake that turns a registration token
// ("Authorization: RemoteAuth TOKEN") into the actions service's URL and an
// admin token (a JWT whose exp the client reads to refresh it in time).
func (s *Sim) handleRunnerRegistration(w http.ResponseWriter, r *http.Request) {
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	s.mu.Lock()
	known := strings.EqualFold(scheme, "RemoteAuth") && s.regTokens[tok]
	admin := ""
	if known {
		admin = fakeJWT(time.Now().Add(adminTokenTTL))
		s.adminTokens[admin] = true
	}
	s.mu.Unlock()
	if !known {
		writeError(w, http.StatusUnauthorized, "Bad credentials: want RemoteAuth and a registration token", docsURL)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"url": s.baseURLFor(r) + ActionsPrefix, "token": admin})
}

// fakeJWT is an unsigned-in-effect JWT: the client parses it unverified for
// its exp claim only.
func fakeJWT(exp time.Time) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body := enc.EncodeToString([]byte(`{"exp":` + strconv.FormatInt(exp.Unix(), 10) + `,"jti":"` + randHex(8) + `"}`))
	return head + "." + body + "." + enc.EncodeToString([]byte(randHex(16)))
}

// actionsAuthed requires a bearer token the sim issued: an admin token, or a
// live session's message queue token (acquirejobs is called with that).
func (s *Sim) actionsAuthed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		s.mu.Lock()
		ok := strings.EqualFold(scheme, "Bearer") && (s.adminTokens[tok] || s.sessionByTokenLocked(tok) != nil)
		s.mu.Unlock()
		if !ok {
			actionsError(w, http.StatusUnauthorized, "VssUnauthorizedException", "token unknown or expired: refresh the admin connection")
			return
		}
		h(w, r)
	})
}

// actionsError writes the actions service's error shape, which the client
// maps by typeName (AgentNotFoundException, AgentExistsException, …).
func actionsError(w http.ResponseWriter, code int, typeName, msg string) {
	writeJSON(w, code, map[string]string{"typeName": typeName, "message": msg})
}

func (s *Sim) handleRunnerGroups(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("groupName")
	var list []map[string]any
	if name == "" || strings.EqualFold(name, "default") {
		list = append(list, map[string]any{"id": defaultRunnerGroupID, "name": "Default", "size": 0, "isDefaultGroup": true})
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(list), "value": list})
}

type scaleSetBody struct {
	Name          string `json:"name"`
	RunnerGroupID int    `json:"runnerGroupId"`
	Labels        []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	} `json:"labels"`
}

func (b scaleSetBody) labelNames() []string {
	out := make([]string, 0, len(b.Labels))
	for _, l := range b.Labels {
		out = append(out, l.Name)
	}
	return out
}

func (s *Sim) setJSONLocked(set *scaleSet, base string) map[string]any {
	labels := make([]map[string]any, 0, len(set.labels))
	for _, l := range set.labels {
		labels = append(labels, map[string]any{"name": l, "type": "System"})
	}
	return map[string]any{"id": set.id, "name": set.name, "runnerGroupId": set.groupID, "runnerGroupName": runnerGroupName(int64(set.groupID)),
		"labels": labels, "RunnerSetting": map[string]any{}, "createdOn": set.createdOn,
		"runnerJitConfigUrl": base + scaleSetsPath + "/" + strconv.Itoa(set.id) + "/generatejitconfig",
		"statistics":         s.statsLocked(set)}
}

// handleListScaleSets answers ?runnerGroupId=&name= with {"count","value"}.
func (s *Sim) handleListScaleSets(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	group, _ := strconv.Atoi(q.Get("runnerGroupId"))
	base := s.baseURLFor(r)
	s.mu.Lock()
	list := []map[string]any{}
	for _, set := range s.sortedSetsLocked() {
		if (group == 0 || set.groupID == group) && (q.Get("name") == "" || strings.EqualFold(q.Get("name"), set.name)) {
			list = append(list, s.setJSONLocked(set, base))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"count": len(list), "value": list})
}

// handleCreateScaleSet creates a set (200, as the service answers); 409 when
// the group already holds a set of that name; 400 without name or labels.
func (s *Sim) handleCreateScaleSet(w http.ResponseWriter, r *http.Request) {
	var b scaleSetBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.Name == "" || len(b.Labels) == 0 {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "a scale set needs a name and at least one label")
		return
	}
	if b.RunnerGroupID == 0 {
		b.RunnerGroupID = defaultRunnerGroupID
	}
	base := s.baseURLFor(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.sets {
		if o.groupID == b.RunnerGroupID && strings.EqualFold(o.name, b.Name) {
			actionsError(w, http.StatusConflict, "RunnerScaleSetExistsException", "a scale set named "+b.Name+" exists in this group")
			return
		}
	}
	s.nextSet++
	set := &scaleSet{id: s.nextSet, groupID: b.RunnerGroupID, name: b.Name, labels: b.labelNames(), createdOn: time.Now().UTC()}
	s.sets[set.id] = set
	s.offerQueuedLocked()
	s.log.Info("scale set created", "id", set.id, "name", set.name, "labels", set.labels)
	writeJSON(w, http.StatusOK, s.setJSONLocked(set, base))
}

func (s *Sim) setOf(w http.ResponseWriter, r *http.Request) *scaleSet {
	id, _ := strconv.Atoi(r.PathValue("id"))
	set := s.sets[id]
	if set == nil {
		actionsError(w, http.StatusNotFound, "RunnerScaleSetNotFoundException", "no scale set "+r.PathValue("id"))
	}
	return set
}

func (s *Sim) handleGetScaleSet(w http.ResponseWriter, r *http.Request) {
	base := s.baseURLFor(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if set := s.setOf(w, r); set != nil {
		writeJSON(w, http.StatusOK, s.setJSONLocked(set, base))
	}
}

// handleUpdateScaleSet replaces the name, group and labels given.
func (s *Sim) handleUpdateScaleSet(w http.ResponseWriter, r *http.Request) {
	var b scaleSetBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "body is not a scale set")
		return
	}
	base := s.baseURLFor(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.setOf(w, r)
	if set == nil {
		return
	}
	if b.Name != "" {
		set.name = b.Name
	}
	if b.RunnerGroupID != 0 {
		set.groupID = b.RunnerGroupID
	}
	if len(b.Labels) > 0 {
		set.labels = b.labelNames()
		s.offerQueuedLocked()
	}
	writeJSON(w, http.StatusOK, s.setJSONLocked(set, base))
}

func (s *Sim) handleDeleteScaleSet(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if set := s.setOf(w, r); set != nil {
		delete(s.sets, set.id)
		w.WriteHeader(http.StatusNoContent)
	}
}

// offerQueuedLocked puts every queued job no set holds yet into the first
// set (by id) whose labels cover the job's, and tells that set.
func (s *Sim) offerQueuedLocked() {
	for _, j := range s.openJobsLocked() {
		if j.set == 0 && j.open() {
			s.offerLocked(j)
		}
	}
}

// offerLocked gives job j to its scale set, if one covers its labels, and
// queues JobAvailable for it.
func (s *Sim) offerLocked(j *job) {
	for _, set := range s.sortedSetsLocked() {
		if labelsMatch(j.labels, set.labels) {
			j.set, j.setState = set.id, setAvailable
			s.pushLocked(set, "JobAvailable", j, nil)
			return
		}
	}
}

// ssJIT is the body of generatejitconfig.
type ssJIT struct {
	Name       string `json:"name"`
	WorkFolder string `json:"workFolder"`
}

// handleScaleSetJIT registers a runner of the set and answers
// {"runner":{id,name,runnerScaleSetId},"encodedJITConfig"}; the config is the
// same as the REST JIT config's, so RunRunner runs it. A name taken answers
// 409 AgentExistsException.
func (s *Sim) handleScaleSetJIT(w http.ResponseWriter, r *http.Request) {
	var b ssJIT
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.Name == "" {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "generatejitconfig needs a runner name")
		return
	}
	base := s.baseURLFor(r)
	s.mu.Lock()
	set := s.setOf(w, r)
	if set == nil {
		s.mu.Unlock()
		return
	}
	if s.nameTakenLocked(b.Name) {
		s.mu.Unlock()
		actionsError(w, http.StatusConflict, "AgentExistsException", "a runner named "+b.Name+" exists")
		return
	}
	s.nextRunner++
	rn := &runner{id: s.nextRunner, name: b.Name, labels: slices.Clone(set.labels), groupID: int64(set.groupID),
		workFolder: cmpOr(b.WorkFolder, "_work"), scope: "org", token: randHex(20), set: set.id}
	s.registerLocked(rn)
	s.tokens[rn.token] = rn
	cfg, _ := json.Marshal(JITConfig{SimURL: base, RunnerID: rn.id, RunnerName: rn.name, Labels: rn.labels,
		WorkFolder: rn.workFolder, Token: rn.token})
	enc := base64.StdEncoding.EncodeToString(cfg)
	s.minted = append(s.minted, enc, rn.token)
	s.mu.Unlock()
	s.log.Info("scale set runner registered", "set", set.id, "runner", rn.name, "runner_id", rn.id)
	writeJSON(w, http.StatusOK, map[string]any{"runner": agentJSON(rn), "encodedJITConfig": enc})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func agentJSON(rn *runner) map[string]any {
	return map[string]any{"id": rn.id, "name": rn.name, "runnerScaleSetId": rn.set}
}

// handleListAgents answers ?agentName= with {"count","value"}.
func (s *Sim) handleListAgents(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("agentName")
	s.mu.Lock()
	list := []map[string]any{}
	for _, rn := range s.sortedRunnersLocked("") {
		if name == "" || strings.EqualFold(rn.name, name) {
			list = append(list, agentJSON(rn))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"count": len(list), "value": list})
}

func (s *Sim) agentOf(w http.ResponseWriter, r *http.Request) *runner {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	rn := s.runners[id]
	if rn == nil {
		actionsError(w, http.StatusNotFound, "AgentNotFoundException", "no runner "+r.PathValue("id"))
	}
	return rn
}

func (s *Sim) handleGetAgent(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rn := s.agentOf(w, r); rn != nil {
		writeJSON(w, http.StatusOK, agentJSON(rn))
	}
}

// handleDeleteAgent removes a runner: 204; 404 AgentNotFoundException when
// unknown; 400 JobStillRunningException while it runs a job.
func (s *Sim) handleDeleteAgent(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.agentOf(w, r)
	switch {
	case rn == nil:
		return
	case rn.busy():
		actionsError(w, http.StatusBadRequest, "JobStillRunningException", "runner "+rn.name+" is still running a job")
		return
	}
	rn.deleted = true
	s.unregisterLocked(rn)
	s.notifyLocked()
	w.WriteHeader(http.StatusNoContent)
}
