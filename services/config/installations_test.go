package config

import (
	"strings"
	"testing"
)

// Given dispatcher.github as a list, when it is parsed, then the first
// entry is the default installation with its defaults, the rest follow
// in order with theirs, and a pool names its installation.
func TestGitHubAsAListIsEveryInstallationInOrder(t *testing.T) {
	c, err := Parse([]byte(`
dispatcher:
  webhook_secret: s
  github:
    - {token: a, org: acme}
    - {name: globex, token: b, org: globex, api_url: "http://ghes.test/api/v3/", webhook_secret: g}
agents:
  - host: h1
    backend: {kind: exec, exec: {create: [sh, c], stop: [sh, s]}}
    pools:
      acme-mac: {labels: [self-hosted, macos], slots: 1}
      globex-mac: {labels: [self-hosted, macos], slots: 1, installation: globex}
`))
	if err != nil {
		t.Fatal(err)
	}
	all := c.Dispatcher.GitHub.Installations()
	if len(all) != 2 || all[0].Org != "acme" || all[1].Name != "globex" || all[1].APIURL != "http://ghes.test/api/v3/" {
		t.Fatalf("installations %+v", all)
	}
	if all[1].Scope != "org" || all[1].Intake != IntakeWebhooks || all[0].More != nil {
		t.Errorf("the second installation lacks its defaults, or the first holds the rest: %+v", all)
	}
	if c.Dispatcher.GitHub.InstallationOf(0) != "" || c.Dispatcher.GitHub.InstallationOf(1) != "globex" {
		t.Errorf("installation names for facts: %q, %q", c.Dispatcher.GitHub.InstallationOf(0), c.Dispatcher.GitHub.InstallationOf(1))
	}
	if p := c.Agents[0].AdvertisedPools()["globex-mac"]; p.Installation != "globex" {
		t.Errorf("pool globex-mac advertises installation %q", p.Installation)
	}
}

// Given a list with an unnamed second entry, a name given twice and a
// pool naming no entry, then each is reported with what to change.
func TestInstallationsAreNamedOnceAndPoolsNameOneOfThem(t *testing.T) {
	_, err := Parse([]byte(`
dispatcher:
  webhook_secret: s
  github:
    - {token: a, org: acme}
    - {token: b, org: b}
    - {name: c, token: c, org: c}
    - {name: c, token: d, org: d}
agents:
  - host: h1
    backend: {kind: exec, exec: {create: [sh, c], stop: [sh, s]}}
    pools:
      x: {labels: [self-hosted], slots: 1, installation: nowhere}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"dispatcher.github[1].name: name every installation", `dispatcher.github[3].name "c": given twice`,
		`agents[0].pools.x.installation "nowhere"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}
