package natsauth_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/berth-ci/berth/services/natsauth"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Given two hosts, when the authorization is written, then nats-server
// parses it into the BERTH account (JetStream on) with one user per role
// and the SYS system account; every seed file is 0600 and opens to the key
// the config names; each agent may publish its own host's subjects and not
// the other's; and a host name that is not a subject token is refused.
func TestWrittenAuthorizationParsesWithOneKeyPerRole(t *testing.T) {
	a, err := natsauth.Generate([]string{"mac-1", "linux-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := a.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1+7 {
		t.Fatalf("wrote %v, want auth.conf and 7 seeds", files)
	}
	conf := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:-1\njetstream {store_dir: \""+dir+"\"}\ninclude auth.conf\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses the config: %v\n%s", err, a.Config())
	}
	if opts.SystemAccount != natsauth.SystemAccount || len(opts.Nkeys) != 7 {
		t.Fatalf("system account %q, %d nkey users; want %s and 7", opts.SystemAccount, len(opts.Nkeys), natsauth.SystemAccount)
	}
	byKey := map[string]*server.NkeyUser{}
	for _, u := range opts.Nkeys {
		byKey[u.Nkey] = u
	}
	for _, u := range a.Users {
		seed, err := os.ReadFile(filepath.Join(dir, u.Role+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(filepath.Join(dir, u.Role+".nk")); st.Mode().Perm() != 0o600 {
			t.Errorf("%s.nk mode %v, want 0600", u.Role, st.Mode().Perm())
		}
		kp, err := nkeys.FromSeed([]byte(string(seed[:len(seed)-1])))
		if err != nil {
			t.Fatalf("%s.nk: %v", u.Role, err)
		}
		if pub, _ := kp.PublicKey(); byKey[pub] == nil {
			t.Errorf("%s's seed opens to %s, which the config does not name", u.Role, pub)
		}
	}
	agent := byKey[a.User(natsauth.AgentRole("mac-1")).Public]
	if agent.Account.Name != natsauth.Account || agent.Permissions == nil ||
		!slices.Contains(agent.Permissions.Publish.Allow, "berth.evt.host.mac-1.agent") || slices.Contains(agent.Permissions.Publish.Allow, "berth.evt.host.mac-1.watchdog") ||
		slices.Contains(agent.Permissions.Publish.Allow, "berth.evt.host.linux-1.agent") {
		t.Errorf("mac-1's agent: account %v, permissions %+v", agent.Account, agent.Permissions)
	}
	if _, err := natsauth.Generate([]string{"bad.host"}, nil); err == nil {
		t.Error("a host name with a dot was accepted")
	}
}
