package natsauth_test

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/natsauth"
)

var updateDoc = flag.Bool("update-doc", false, "rewrite the permission table in docs/security-nats.md")

// The permission table in docs/security-nats.md is natsauth.Table, so what
// the doc says each role may do is what Generate hands out.
func TestSecurityDocTableIsGenerated(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "security-nats.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, natsauth.TableBegin), strings.Index(doc, natsauth.TableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q … %q markers", path, natsauth.TableBegin, natsauth.TableEnd)
	}
	want := natsauth.Table([]string{"HOST"}, []string{"INSTANCE"})
	got := doc[i+len(natsauth.TableBegin)+1 : j]
	if got == want {
		return
	}
	if *updateDoc {
		doc = doc[:i+len(natsauth.TableBegin)+1] + want + doc[j:]
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's permission table differs from natsauth.Table: run go test ./services/natsauth -run DocTable -update-doc\nwant:\n%s", path, want)
}

// Every role but admin is denied the stream's and buckets' administration
// and the trust bucket; only admin may write the trust keys.
func TestOnlyTheAdminAdministersTheStream(t *testing.T) {
	for _, u := range natsauth.Permissions([]string{"host-a"}, nil) {
		if u.Account != natsauth.Account {
			continue
		}
		admin := u.Role == natsauth.RoleAdmin
		for _, s := range append(append([]string{}, u.Publish...), u.API...) {
			if !admin && (strings.Contains(s, "STREAM.CREATE") || strings.Contains(s, "STREAM.UPDATE") || s == "$JS.API.>" ||
				strings.HasPrefix(s, "$KV.berth_trust")) {
				t.Errorf("%s may publish %s", u.Role, s)
			}
		}
		if !admin && !slices.Contains(u.Deny, "$JS.API.STREAM.UPDATE.>") {
			t.Errorf("%s is not denied stream updates: %v", u.Role, u.Deny)
		}
		if len(u.Subscribe) == 0 || !strings.HasPrefix(u.Subscribe[0], natsauth.InboxPrefix(u.Role)+".") {
			t.Errorf("%s subscribes to %v, want its own inbox prefix first", u.Role, u.Subscribe)
		}
	}
}

// Law 10: a role touches no consumer but its own. Every consumer subject of
// the log's API that a role but admin may use (create, info, pull, delete,
// ack) names one consumer exactly, never a wildcard, and that name is the
// role's own; no two roles are granted the same name, even where a host is
// named like another's consumer; only the watchdog may make consumers on a
// bucket (the heartbeats it watches), and nobody a legacy or unnamed one.
func TestEachRoleIsGrantedOnlyItsOwnConsumersByName(t *testing.T) {
	hosts := []string{"a", "a-watch", "hostwatch-a", "agent-a"}
	instances := []string{"1", "agent-a"}
	owner := map[string]string{} // consumer name → role
	for _, u := range natsauth.Permissions(hosts, instances) {
		if u.Account != natsauth.Account || u.Role == natsauth.RoleAdmin {
			continue
		}
		for _, s := range u.API {
			name, ok := consumerOf(s)
			if !ok {
				if strings.Contains(s, "CONSUMER") || strings.HasPrefix(s, "$JS.ACK") {
					if u.Role != natsauth.RoleWatchdog || !strings.Contains(s, ".KV_berth_heartbeats.") {
						t.Errorf("%s may use %s: a consumer subject not on one named consumer of the log", u.Role, s)
					}
				}
				continue
			}
			if strings.ContainsAny(name, "*>") {
				t.Errorf("%s may use %s: a wildcard consumer name", u.Role, s)
			}
			if o, seen := owner[name]; seen && o != u.Role {
				t.Errorf("consumer %s is granted to both %s and %s", name, o, u.Role)
			}
			owner[name] = u.Role
		}
	}
	want := map[string]string{
		"berth-dispatcher-1": natsauth.RoleDispatcher, "berth-watchdog-agent-a": natsauth.RoleWatchdog,
		"berth-agent-a": natsauth.AgentRole("a"), "berth-hostwatch-a": natsauth.AgentRole("a"),
		"berth-agent-a-watch": natsauth.AgentRole("a-watch"),
	}
	for name, role := range want {
		if owner[name] != role {
			t.Errorf("consumer %s is granted to %q, want %s", name, owner[name], role)
		}
	}
}

// consumerOf is the consumer a subject of the log's consumer API or acks
// names: $JS.API.CONSUMER.<op>.BERTH_EVENTS.<name>[.<filter>] or
// $JS.ACK.BERTH_EVENTS.<name>.>.
func consumerOf(s string) (string, bool) {
	for _, p := range []string{"$JS.API.CONSUMER.CREATE.BERTH_EVENTS.", "$JS.API.CONSUMER.INFO.BERTH_EVENTS.",
		"$JS.API.CONSUMER.DELETE.BERTH_EVENTS.", "$JS.API.CONSUMER.MSG.NEXT.BERTH_EVENTS.", "$JS.ACK.BERTH_EVENTS."} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			name, _, _ := strings.Cut(rest, ".")
			return name, true
		}
	}
	return "", false
}
