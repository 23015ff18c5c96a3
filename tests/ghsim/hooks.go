package ghsim

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
)

const docsHookDeliveriesURL = "https://docs.github.com/rest/apps/webhooks"

// HookID is the id of the sim's one webhook: the organization hook
// (/orgs/{org}/hooks/{hook_id}/deliveries), the repository hook
// (/repos/{owner}/{repo}/hooks/{hook_id}/deliveries) and the App's hook
// (/app/hook/deliveries) all list the same deliveries.
func (s *Sim) HookID() int64 { return s.hookID }

// handleListHookDeliveries mimics "List deliveries for an app webhook" and
// its organization and repository variants: the hook-delivery-item shape
// of GitHub's REST reference (id, guid, delivered_at, redelivery, duration,
// status, status_code, event, action, installation_id, repository_id,
// throttled_at), newest first, one row per attempt (a redelivery is a row of
// its own with its original's guid), only attempts that ended. per_page
// (default 30, at most 100) and a cursor given back in the Link header's
// rel="next" page through older rows.
func (s *Sim) handleListHookDeliveries(w http.ResponseWriter, r *http.Request) {
	if !s.ourHook(w, r) {
		return
	}
	_, perPage := pageParams(r)
	cursor, _ := strconv.ParseInt(r.URL.Query().Get("cursor"), 10, 64)
	base := s.baseURLFor(r)
	s.mu.Lock()
	var rows []map[string]any
	more := int64(0)
	for _, d := range slices.Backward(s.deliveries) {
		if !d.view.Done || (cursor > 0 && d.num >= cursor) {
			continue
		}
		if len(rows) == perPage {
			more = rows[len(rows)-1]["id"].(int64)
			break
		}
		rows = append(rows, s.hookDeliveryRowLocked(d))
	}
	s.mu.Unlock()
	if more > 0 {
		q := url.Values{"per_page": {strconv.Itoa(perPage)}, "cursor": {strconv.FormatInt(more, 10)}}
		w.Header().Set("Link", "<"+base+r.URL.Path+"?"+q.Encode()+`>; rel="next"`)
	}
	if rows == nil {
		rows = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, rows)
}

func (s *Sim) hookDeliveryRowLocked(d *delivery) map[string]any {
	status := "OK"
	switch c := d.view.StatusCode; {
	case c == 0:
		status = "failed to connect to host"
	case c < 200 || c > 299:
		status = "Invalid HTTP Response: " + strconv.Itoa(c)
	}
	var inst, repo any
	if m, ok := s.fx.hookQueued["installation"].(map[string]any); ok {
		inst = m["id"]
	}
	if m, ok := s.fx.hookQueued["repository"].(map[string]any); ok {
		repo = m["id"]
	}
	return map[string]any{
		"id": d.num, "guid": d.view.ID, "delivered_at": ghTime(d.at), "redelivery": d.view.Redelivery,
		"duration": d.view.Duration.Seconds(), "status": status, "status_code": d.view.StatusCode,
		"event": d.view.Event, "action": d.view.Action, "installation_id": inst, "repository_id": repo,
		"throttled_at": nil,
	}
}

// handleRedeliverHookDelivery mimics "Redeliver a delivery for an app
// webhook" and its organization and repository variants: 202 Accepted with
// an empty object, and the attempt's delivery is sent again with the same
// X-GitHub-Delivery; 404 for an unknown attempt id.
func (s *Sim) handleRedeliverHookDelivery(w http.ResponseWriter, r *http.Request) {
	if !s.ourHook(w, r) {
		return
	}
	num, _ := pathInt64(r, "delivery_id")
	s.mu.Lock()
	guid := ""
	for _, d := range s.deliveries {
		if d.num == num {
			guid = d.view.ID
		}
	}
	s.mu.Unlock()
	if guid == "" {
		writeError(w, http.StatusNotFound, "Not Found", docsHookDeliveriesURL)
		return
	}
	if err := s.Redeliver(guid); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), docsHookDeliveriesURL)
		return
	}
	s.log.Info("redelivery requested through the API", "delivery", guid, "attempt", num)
	writeJSON(w, http.StatusAccepted, map[string]any{})
}

// ourHook 404s a hook id that is not the sim's (the App routes carry none).
func (s *Sim) ourHook(w http.ResponseWriter, r *http.Request) bool {
	if v := r.PathValue("hook_id"); v != "" {
		if id, err := strconv.ParseInt(v, 10, 64); err != nil || id != s.hookID {
			writeError(w, http.StatusNotFound, "Not Found", docsHookDeliveriesURL)
			return false
		}
	}
	return true
}
