package config

import (
	"strings"
	"testing"
)

const agentYAML = `
agents:
  - host: a
    pools: {linux: {labels: [self-hosted, linux], slots: 1}}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
`

// reconcile_redeliver is off by default; on, it needs to know whose webhook
// deliveries to read: the App's, or the org or repository webhook hook_id
// names (with org, or hook_repo as owner/repo).
func TestRedeliverNeedsAWebhookToRead(t *testing.T) {
	c, err := Parse([]byte(agentYAML))
	if err != nil {
		t.Fatal(err)
	}
	if c.Dispatcher.ReconcileRedeliver {
		t.Fatal("redelivery is on by default")
	}
	for _, tc := range []struct {
		yaml, complaint string
	}{
		{`dispatcher: {reconcile_redeliver: true}`, "reconcile_redeliver needs"},
		{`dispatcher: {reconcile_redeliver: true, github: {hook_id: 42}}`, "hook_id 42: set dispatcher.github.org"},
		{`dispatcher: {reconcile_redeliver: true, github: {hook_id: 42, hook_repo: just-a-repo}}`, "hook_repo \"just-a-repo\""},
		{`dispatcher: {reconcile_redeliver: true, github: {hook_id: 42, org: example-org}}`, ""},
		{`dispatcher: {reconcile_redeliver: true, github: {hook_id: 42, hook_repo: example-org/example-repo}}`, ""},
		{`dispatcher: {reconcile_redeliver: true, github: {app: {id: 1, installation_id: 2, private_key_file: k.pem}}}`, ""},
	} {
		_, err := Parse([]byte(tc.yaml + agentYAML))
		switch {
		case tc.complaint == "" && err != nil:
			t.Errorf("%s: %v", tc.yaml, err)
		case tc.complaint != "" && (err == nil || !strings.Contains(err.Error(), tc.complaint)):
			t.Errorf("%s: %v, want an error saying %q", tc.yaml, err, tc.complaint)
		}
	}
}
