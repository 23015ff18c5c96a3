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
	want := natsauth.Table([]string{"HOST"})
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
	for _, u := range natsauth.Permissions([]string{"host-a"}) {
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
