package ghsim

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// JITConfig is the decoded form of the sim's encoded_jit_config: the standard
// base64 encoding of this struct as JSON. (GitHub's real value is an opaque
// blob of runner credential files; the sim's only consumer is RunRunner.)
type JITConfig struct {
	SimURL     string   `json:"sim_url"`     // sim base URL, e.g. http://127.0.0.1:PORT
	RunnerID   int64    `json:"runner_id"`   // id of the registered runner
	RunnerName string   `json:"runner_name"` // name given to generate-jitconfig
	Labels     []string `json:"labels"`      // runner labels
	WorkFolder string   `json:"work_folder"` // work_folder given, default "_work"
	Token      string   `json:"token"`       // secret the runner presents to /_sim/runner/*
}

// DecodeJITConfig decodes an encoded_jit_config produced by the sim. It errors
// on invalid base64, invalid JSON, or a config without sim_url or token.
func DecodeJITConfig(encoded string) (JITConfig, error) {
	var c JITConfig
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(encoded))
	if err != nil {
		return c, fmt.Errorf("ghsim: jit config is not base64: %w", err)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("ghsim: jit config is not JSON: %w", err)
	}
	if c.SimURL == "" || c.Token == "" {
		return c, fmt.Errorf("ghsim: jit config lacks sim_url or token")
	}
	return c, nil
}

// readOnlyLabels are the default labels GitHub marks "read-only"; others are "custom".
var readOnlyLabels = []string{"self-hosted", "linux", "windows", "macos", "x64", "arm", "arm64"}

type jitRequest struct {
	Name          string   `json:"name"`
	RunnerGroupID int64    `json:"runner_group_id"`
	Labels        []string `json:"labels"`
	WorkFolder    string   `json:"work_folder"`
}

// handleJITConfig mimics "Create configuration for a just-in-time runner": it
// registers an offline ephemeral runner and answers 201 with the shape of
// api/runners.generate-jitconfig.201.json. 422 on a missing name, runner group
// or labels; 409 when a registered runner already has the name.
func (s *Sim) handleJITConfig(w http.ResponseWriter, r *http.Request) {
	var req jitRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON", docsSelfHostedRunnerURL)
		return
	}
	switch {
	case req.Name == "":
		writeError(w, http.StatusUnprocessableEntity, "Invalid request.\n\n\"name\" wasn't supplied.", docsSelfHostedRunnerURL)
		return
	case req.RunnerGroupID <= 0:
		writeError(w, http.StatusUnprocessableEntity, "Invalid request.\n\n\"runner_group_id\" must be a positive integer.", docsSelfHostedRunnerURL)
		return
	case len(req.Labels) == 0 || len(req.Labels) > 100:
		writeError(w, http.StatusUnprocessableEntity, "Invalid request.\n\n\"labels\" must contain between 1 and 100 items.", docsSelfHostedRunnerURL)
		return
	}
	if req.WorkFolder == "" {
		req.WorkFolder = "_work"
	}
	base := s.baseURLFor(r)

	s.mu.Lock()
	if s.nameTakenLocked(req.Name) {
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "Already exists - A runner with the name "+req.Name+" already exists.", docsSelfHostedRunnerURL)
		return
	}
	s.nextRunner++
	rn := &runner{
		id: s.nextRunner, name: req.Name, labels: slices.Clone(req.Labels), groupID: req.RunnerGroupID,
		workFolder: req.WorkFolder, scope: scopeOf(r), token: randHex(20),
	}
	s.registerLocked(rn)
	s.tokens[rn.token] = rn
	body := copyObj(s.fx.jitConfig)
	s.fillRunnerLocked(obj(body, "runner"), rn)
	s.mu.Unlock()

	cfg, _ := json.Marshal(JITConfig{SimURL: base, RunnerID: rn.id, RunnerName: rn.name,
		Labels: rn.labels, WorkFolder: rn.workFolder, Token: rn.token})
	body["encoded_jit_config"] = base64.StdEncoding.EncodeToString(cfg)
	s.mu.Lock()
	s.minted = append(s.minted, body["encoded_jit_config"].(string), rn.token)
	lose := s.loseJIT != nil && s.loseJIT(rn.name)
	s.mu.Unlock()
	if lose {
		s.log.Info("runner registered; its JIT answer is lost", "runner", rn.name, "runner_id", rn.id)
		if !loseAnswer(w) {
			writeError(w, http.StatusBadGateway, "Server Error", "")
		}
		return
	}
	s.log.Info("runner registered", "runner", rn.name, "runner_id", rn.id, "labels", rn.labels, "scope", rn.scope)
	writeJSON(w, http.StatusCreated, body)
}

// fillRunnerLocked overwrites a runner object (fixture shape) with rn's state.
func (s *Sim) fillRunnerLocked(o map[string]any, rn *runner) {
	o["id"] = rn.id
	o["name"] = rn.name
	o["os"] = runnerOS(rn.labels)
	v := s.runnerViewLocked(rn)
	o["status"], o["busy"] = v.Status, v.Busy
	if _, ok := o["ephemeral"]; ok {
		o["ephemeral"] = true
	}
	labels := make([]any, 0, len(rn.labels))
	for _, l := range rn.labels {
		id, ok := s.labelIDs[strings.ToLower(l)]
		if !ok {
			id = int64(len(s.labelIDs) + 1)
			s.labelIDs[strings.ToLower(l)] = id
		}
		typ := "custom"
		if slices.Contains(readOnlyLabels, strings.ToLower(l)) {
			typ = "read-only"
		}
		labels = append(labels, map[string]any{"id": id, "name": l, "type": typ})
	}
	o["labels"] = labels
}

func runnerOS(labels []string) string {
	for _, l := range labels {
		switch strings.ToLower(l) {
		case "linux":
			return "linux"
		case "macos", "osx":
			return "macos"
		case "windows":
			return "windows"
		}
	}
	return "unknown"
}

// lookupRunnerLocked finds a registered runner by the {runner_id} path value
// within the route's scope.
func (s *Sim) lookupRunnerLocked(r *http.Request) *runner {
	id, ok := pathInt64(r, "runner_id")
	if !ok {
		return nil
	}
	rn := s.runners[id]
	if rn == nil || rn.scope != scopeOf(r) {
		return nil
	}
	return rn
}

// handleListRunners mimics "List self-hosted runners" for an org or repo:
// {"total_count":N,"runners":[...]} shaped like api/runners.list.200.json, with
// ?name= filtering and per_page/page pagination (Link header).
func (s *Sim) handleListRunners(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	base := s.baseURLFor(r)
	s.mu.Lock()
	var all []*runner
	for _, rn := range s.sortedRunnersLocked(scopeOf(r)) {
		if name == "" || strings.EqualFold(name, rn.name) {
			all = append(all, rn)
		}
	}
	lo, hi := paginate(w, r, base, len(all))
	list := make([]any, 0, hi-lo)
	for _, rn := range all[lo:hi] {
		o := firstOf(s.fx.runnersList, "runners")
		s.fillRunnerLocked(o, rn)
		list = append(list, o)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"total_count": len(all), "runners": list})
}

// handleGetRunner mimics "Get a self-hosted runner": api/runners.get.200.json
// shape, 404 when unknown (or already deleted).
func (s *Sim) handleGetRunner(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	rn := s.lookupRunnerLocked(r)
	if rn == nil {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Not Found", docsSelfHostedRunnerURL)
		return
	}
	o := copyObj(s.fx.runnerGet)
	s.fillRunnerLocked(o, rn)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, o)
}

// handleDeleteRunner mimics "Delete a self-hosted runner": 204 No Content, 404
// when unknown, 422 "Bad request - Runner \"NAME\" is still running a job" when
// busy. A deleted runner that later polls is refused (410).
func (s *Sim) handleDeleteRunner(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	rn := s.lookupRunnerLocked(r)
	switch {
	case rn == nil:
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Not Found", docsSelfHostedRunnerURL)
		return
	case rn.busy():
		s.mu.Unlock()
		writeError(w, http.StatusUnprocessableEntity, `Bad request - Runner "`+rn.name+`" is still running a job`, docsSelfHostedRunnerURL)
		return
	}
	rn.deleted = true
	s.unregisterLocked(rn)
	s.notifyLocked()
	s.mu.Unlock()
	s.log.Info("runner deleted", "runner", rn.name, "runner_id", rn.id)
	w.WriteHeader(http.StatusNoContent)
}

// registerLocked adds a runner; its name must not be taken.
func (s *Sim) registerLocked(rn *runner) {
	s.runners[rn.id] = rn
	s.runnerNames[strings.ToLower(rn.name)] = rn.id
}

// unregisterLocked removes a runner, and frees its name.
func (s *Sim) unregisterLocked(rn *runner) {
	delete(s.runners, rn.id)
	if s.runnerNames[strings.ToLower(rn.name)] == rn.id {
		delete(s.runnerNames, strings.ToLower(rn.name))
	}
}

// nameTakenLocked reports whether a registered runner has name, in any
// case: GitHub refuses a second runner of one name (409).
func (s *Sim) nameTakenLocked(name string) bool {
	_, ok := s.runnerNames[strings.ToLower(name)]
	return ok
}
