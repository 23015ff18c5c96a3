package install

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// update rewrites the reference copies in deploy/ from the generator:
// BERTH_UPDATE_DEPLOY=1 go test ./services/install/
var update = os.Getenv("BERTH_UPDATE_DEPLOY") == "1"

const agentYAML = `agents:
  - host: host-a
    pools:
      linux: {labels: [self-hosted, linux], slots: 2}
    backend:
      exec: {create: [/bin/true], stop: [/bin/true]}
`

// target is a temporary root with a berth binary in it, plus a config and
// credentials to install from outside it.
type target struct {
	root, cfg, creds string
}

func newTarget(t *testing.T, yaml string) target {
	t.Helper()
	root := t.TempDir()
	bin := filepath.Join(root, "usr/local/bin/berth")
	must(t, os.MkdirAll(filepath.Dir(bin), 0o755))
	must(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
	src := t.TempDir()
	cfg := filepath.Join(src, "agent.yaml")
	must(t, os.WriteFile(cfg, []byte(yaml), 0o644))
	creds := filepath.Join(src, "agent.creds")
	must(t, os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\nfake\n------END NATS USER JWT------\n"), 0o644))
	return target{root: root, cfg: cfg, creds: creds}
}

func (tg target) opts(platform string) Options {
	return Options{Root: tg.root, Platform: platform, ConfigFrom: tg.cfg, CredsFrom: tg.creds}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// tree lists every path under root with its mode and contents.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[rel] = v
		return nil
	}))
	return out
}

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	return filepath.Join("..", "..", rel)
}

func TestGeneratedFilesEqualTheReferenceCopiesInDeploy(t *testing.T) {
	// The reference copies are what the default flags write (with
	// credentials given), for a config that sets no drain bounds.
	unit, err := Unit(Options{Platform: Linux, CredsFrom: "x"}, DefaultShutdownTimeout, DefaultStopTimeout)
	must(t, err)
	plist, err := Plist(Options{Platform: Darwin, CredsFrom: "x"}, DefaultShutdownTimeout, DefaultStopTimeout)
	must(t, err)
	for ref, got := range map[string]string{"deploy/systemd/berth-agent.service": unit, "deploy/launchd/ci.berth.agent.plist": plist} {
		path := repoFile(t, ref)
		if update {
			must(t, os.MkdirAll(filepath.Dir(path), 0o755))
			must(t, os.WriteFile(path, []byte(got), 0o644))
		}
		want, err := os.ReadFile(path)
		must(t, err)
		if string(want) != got {
			t.Errorf("%s differs from what berth agent install writes with the default flags; regenerate it with BERTH_UPDATE_DEPLOY=1 go test ./services/install/\n--- generated:\n%s", ref, got)
		}
	}

	// And an install with default flags writes exactly that.
	for platform, want := range map[string]string{Linux: unit, Darwin: plist} {
		tg := newTarget(t, agentYAML)
		res, err := Install(tg.opts(platform))
		must(t, err)
		service := res.Written[len(res.Written)-1]
		got, err := os.ReadFile(filepath.Join(tg.root, service))
		must(t, err)
		if string(got) != want {
			t.Errorf("%s: installed %s differs from the reference", platform, service)
		}
	}
}

func TestUnitCarriesTheDrainBoundsAndRestartPolicy(t *testing.T) {
	tg := newTarget(t, agentYAML+"    shutdown_timeout: 30m\n")
	_, err := Install(Options{Root: tg.root, Platform: Linux, ConfigFrom: tg.cfg, Host: "host-a", User: "ci"})
	must(t, err)
	b, err := os.ReadFile(filepath.Join(tg.root, "etc/systemd/system/berth-agent.service"))
	must(t, err)
	unit := string(b)
	for _, want := range []string{
		"Restart=always", "KillSignal=SIGTERM", "After=network-online.target", "User=ci",
		fmt.Sprintf("TimeoutStopSec=%d\n", int((30*time.Minute + 2*time.Minute + StopMargin).Seconds())),
		"ExecStart=/usr/local/bin/berth agent --config /etc/berth/agent.yaml --host host-a\n",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %q:\n%s", want, unit)
		}
	}
	if strings.Contains(unit, "--nats-creds") {
		t.Error("no credentials were given, but the unit passes --nats-creds")
	}
	if _, err := os.Stat(filepath.Join(tg.root, "etc/berth/nats.creds")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a credentials file was written without --creds-from: %v", err)
	}
}

func TestUnitPassesSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed here; the unit is checked against deploy/systemd only")
	}
	tg := newTarget(t, agentYAML)
	_, err = Install(tg.opts(Linux))
	must(t, err)
	unit, err := os.ReadFile(filepath.Join(tg.root, "etc/systemd/system/berth-agent.service"))
	must(t, err)
	if problems := systemdProblems(t, sa, string(unit)); len(problems) > 0 {
		t.Errorf("systemd-analyze verify:\n%s", strings.Join(problems, "\n"))
	}
	// The check must be able to fail: a bad value and an unknown key.
	broken := strings.Replace(string(unit), "Restart=always", "Restart=sometimes\nRestartBogus=1", 1)
	if problems := systemdProblems(t, sa, broken); len(problems) < 2 {
		t.Errorf("systemd-analyze found %d problems in a broken unit: %v", len(problems), problems)
	}
}

// systemdProblems runs systemd-analyze verify on unit and returns what it
// says about it: errors, and warnings (unknown keys, values it ignores); a
// missing user is expected in a test sandbox. verify needs ExecStart's binary
// to exist, so it is pointed at /bin/true.
func systemdProblems(t *testing.T, sa, unit string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), UnitName)
	must(t, os.WriteFile(path, []byte(strings.Replace(unit, "/usr/local/bin/berth", "/bin/true", 1)), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, sa, "verify", "--man=no", path).CombinedOutput()
	t.Logf("systemd-analyze verify: exit %v, output %q", err, out)
	var problems []string
	if err != nil {
		problems = append(problems, "exit: "+err.Error())
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, UnitName) && !strings.Contains(line, "User") {
			problems = append(problems, line)
		}
	}
	return problems
}

// plistValue checks one value element of a property list (DTD 1.0).
func plistValue(d *xml.Decoder, start xml.StartElement) (any, error) {
	switch start.Name.Local {
	case "string", "integer", "real", "date", "data":
		var s string
		if err := d.DecodeElement(&s, &start); err != nil {
			return nil, err
		}
		if start.Name.Local == "integer" {
			var n int64
			if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err != nil {
				return nil, fmt.Errorf("integer %q: %w", s, err)
			}
			return n, nil
		}
		return s, nil
	case "true", "false":
		if err := d.Skip(); err != nil {
			return nil, err
		}
		return start.Name.Local == "true", nil
	case "array":
		var out []any
		for {
			el, end, err := next(d)
			if err != nil {
				return nil, err
			}
			if end {
				return out, nil
			}
			v, err := plistValue(d, el)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
	case "dict":
		out := map[string]any{}
		for {
			el, end, err := next(d)
			if err != nil {
				return nil, err
			}
			if end {
				return out, nil
			}
			if el.Name.Local != "key" {
				return nil, fmt.Errorf("dict: <%s> where a <key> belongs", el.Name.Local)
			}
			var k string
			if err := d.DecodeElement(&k, &el); err != nil {
				return nil, err
			}
			vel, end, err := next(d)
			if err != nil || end {
				return nil, fmt.Errorf("dict: key %q has no value (%v)", k, err)
			}
			if _, dup := out[k]; dup {
				return nil, fmt.Errorf("dict: key %q twice", k)
			}
			if out[k], err = plistValue(d, vel); err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
		}
	}
	return nil, fmt.Errorf("<%s> is not a plist value", start.Name.Local)
}

// next returns the next start element, or end=true at an end element;
// non-blank text between elements is an error.
func next(d *xml.Decoder) (xml.StartElement, bool, error) {
	for {
		tok, err := d.Token()
		if err != nil {
			return xml.StartElement{}, false, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			return tok, false, nil
		case xml.EndElement:
			return xml.StartElement{}, true, nil
		case xml.CharData:
			if len(bytes.TrimSpace(tok)) > 0 {
				return xml.StartElement{}, false, fmt.Errorf("stray text %q", tok)
			}
		}
	}
}

// parsePlist parses an XML property list: the Apple DOCTYPE, a <plist
// version="1.0"> root holding one value.
func parsePlist(b []byte) (map[string]any, error) {
	d := xml.NewDecoder(bytes.NewReader(b))
	d.Strict = true
	sawDoctype := false
	for {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		switch tok := tok.(type) {
		case xml.Directive:
			if strings.HasPrefix(string(tok), `DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN"`) {
				sawDoctype = true
			}
		case xml.StartElement:
			if tok.Name.Local != "plist" || !slices.Contains(tok.Attr, xml.Attr{Name: xml.Name{Local: "version"}, Value: "1.0"}) || !sawDoctype {
				return nil, fmt.Errorf("root <%s> %v (doctype seen: %v); want the plist DOCTYPE and <plist version=\"1.0\">", tok.Name.Local, tok.Attr, sawDoctype)
			}
			el, end, err := next(d)
			if err != nil || end {
				return nil, fmt.Errorf("empty plist (%v)", err)
			}
			v, err := plistValue(d, el)
			if err != nil {
				return nil, err
			}
			if _, end, err := next(d); !end || err != nil {
				return nil, fmt.Errorf("more than one value in <plist> (%v)", err)
			}
			if _, err := d.Token(); err != io.EOF {
				for {
					if _, err := d.Token(); err == io.EOF {
						break
					} else if err != nil {
						return nil, err
					}
				}
			}
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("the plist holds %T, not a dict", v)
			}
			return m, nil
		}
	}
}

func TestPlistParsesAsAPropertyList(t *testing.T) {
	tg := newTarget(t, agentYAML)
	_, err := Install(Options{Root: tg.root, Platform: Darwin, ConfigFrom: tg.cfg, CredsFrom: tg.creds, Host: "host-a"})
	must(t, err)
	path := filepath.Join(tg.root, "Library/LaunchDaemons/ci.berth.agent.plist")
	b, err := os.ReadFile(path)
	must(t, err)
	p, err := parsePlist(b)
	if err != nil {
		t.Fatalf("the plist does not parse: %v\n%s", err, b)
	}
	wantArgs := []any{"/usr/local/bin/berth", "agent", "--config", "/usr/local/etc/berth/agent.yaml", "--host", "host-a",
		"--nats-creds", "/usr/local/etc/berth/nats.creds"}
	for k, want := range map[string]any{
		"Label": Label, "RunAtLoad": true, "KeepAlive": true, "UserName": "berth",
		"ExitTimeOut":     int64((DefaultShutdownTimeout + DefaultStopTimeout + StopMargin).Seconds()),
		"StandardOutPath": "/usr/local/var/log/berth/agent.log", "StandardErrorPath": "/usr/local/var/log/berth/agent.log",
	} {
		if p[k] != want {
			t.Errorf("%s = %#v, want %#v", k, p[k], want)
		}
	}
	if args, _ := p["ProgramArguments"].([]any); !slices.Equal(args, wantArgs) {
		t.Errorf("ProgramArguments = %#v, want %#v", p["ProgramArguments"], wantArgs)
	}

	// Parsers of record, where they exist.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if plutil, err := exec.LookPath("plutil"); err == nil {
		out, err := exec.CommandContext(ctx, plutil, "-lint", path).CombinedOutput()
		t.Logf("plutil -lint: %s", out)
		if err != nil {
			t.Errorf("plutil -lint: %v: %s", err, out)
		}
	} else {
		t.Log("plutil is not installed here (macOS only)")
	}
	if py, err := exec.LookPath("python3"); err == nil {
		out, err := exec.CommandContext(ctx, py, "-c",
			"import plistlib,sys; p=plistlib.load(open(sys.argv[1],'rb')); print(p['Label'], p['ExitTimeOut'], p['ProgramArguments'])", path).CombinedOutput()
		t.Logf("python3 plistlib: %s", out)
		if err != nil {
			t.Errorf("python3 plistlib cannot load the plist: %v: %s", err, out)
		}
	}
}

func TestPlistParserRejectsBrokenLists(t *testing.T) {
	// The checker above must be able to fail.
	good, err := Plist(Options{Platform: Darwin}, time.Minute, time.Minute)
	must(t, err)
	if _, err := parsePlist([]byte(good)); err != nil {
		t.Fatalf("good plist rejected: %v", err)
	}
	for name, bad := range map[string]string{
		"key without value": strings.Replace(good, "\t<key>RunAtLoad</key>\n\t<true/>\n", "\t<key>RunAtLoad</key>\n", 1),
		"unclosed string":   strings.Replace(good, "</string>", "", 1),
		"no doctype":        strings.Replace(good, "<!DOCTYPE", "<!-- x --><!NOTDOCTYPE", 1),
		"bad integer":       strings.Replace(good, "<integer>5</integer>", "<integer>five</integer>", 1),
	} {
		if _, err := parsePlist([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestInstallThenUninstallLeavesNothingBehind(t *testing.T) {
	for _, platform := range []string{Linux, Darwin} {
		t.Run(platform, func(t *testing.T) {
			tg := newTarget(t, agentYAML)
			before := tree(t, tg.root)
			res, err := Install(tg.opts(platform))
			must(t, err)
			if len(res.Commands) == 0 {
				t.Error("install lists no commands to load the service")
			}
			// The credentials are private.
			creds := "/etc/berth/nats.creds"
			if platform == Darwin {
				creds = "/usr/local/etc/berth/nats.creds"
			}
			fi, err := os.Stat(filepath.Join(tg.root, creds))
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("credentials at %s: %v, %v; want mode 0600", creds, fi, err)
			}
			got, _ := os.ReadFile(filepath.Join(tg.root, creds))
			want, _ := os.ReadFile(tg.creds)
			if !bytes.Equal(got, want) {
				t.Error("the credentials were not copied as given")
			}

			un, err := Uninstall(Options{Root: tg.root, Platform: platform})
			must(t, err)
			if after := tree(t, tg.root); !maps(after, before) {
				t.Errorf("after uninstall the root holds %v; before install it held %v (removed %v)", keys(after), keys(before), un.Removed)
			}
			// Uninstalling again is harmless.
			if _, err := Uninstall(Options{Root: tg.root, Platform: platform}); err != nil {
				t.Errorf("second uninstall: %v", err)
			}
		})
	}
}

func TestUninstallKeepsWhatItDidNotWrite(t *testing.T) {
	tg := newTarget(t, agentYAML)
	_, err := Install(tg.opts(Linux))
	must(t, err)
	mine := filepath.Join(tg.root, "etc/berth/dispatcher.yaml")
	must(t, os.WriteFile(mine, []byte("operator's"), 0o600))
	_, err = Uninstall(Options{Root: tg.root, Platform: Linux})
	must(t, err)
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("uninstall removed a file it did not write: %v", err)
	}
	for _, gone := range []string{"etc/berth/agent.yaml", "etc/berth/nats.creds", "etc/systemd/system/berth-agent.service"} {
		if _, err := os.Stat(filepath.Join(tg.root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", gone, err)
		}
	}
}

func TestUninstallRefusesAnEnabledUnit(t *testing.T) {
	tg := newTarget(t, agentYAML)
	_, err := Install(tg.opts(Linux))
	must(t, err)
	// What systemctl enable makes.
	wants := filepath.Join(tg.root, "etc/systemd/system/multi-user.target.wants")
	must(t, os.MkdirAll(wants, 0o755))
	must(t, os.Symlink("/etc/systemd/system/"+UnitName, filepath.Join(wants, UnitName)))
	_, err = Uninstall(Options{Root: tg.root, Platform: Linux})
	if err == nil || !strings.Contains(err.Error(), "systemctl disable --now") {
		t.Fatalf("Uninstall of an enabled unit = %v; want an error saying to disable it first", err)
	}
	if _, err := os.Stat(filepath.Join(tg.root, "etc/systemd/system", UnitName)); err != nil {
		t.Errorf("the refused uninstall removed the unit: %v", err)
	}
}

func TestInstallTwiceIsIdempotent(t *testing.T) {
	for _, platform := range []string{Linux, Darwin} {
		t.Run(platform, func(t *testing.T) {
			tg := newTarget(t, agentYAML)
			r1, err := Install(tg.opts(platform))
			must(t, err)
			first := tree(t, tg.root)
			r2, err := Install(tg.opts(platform))
			must(t, err)
			if second := tree(t, tg.root); !maps(first, second) {
				t.Errorf("second install changed the tree:\nfirst  %v\nsecond %v", first, second)
			}
			if len(r2.Written) != 0 || !slices.Equal(r1.Written, r2.Unchanged) || fmt.Sprint(r1.Commands) != fmt.Sprint(r2.Commands) {
				t.Errorf("second result %+v, want nothing written, what the first wrote unchanged (first %+v)", r2, r1)
			}
			// And one uninstall still removes everything.
			_, err = Uninstall(Options{Root: tg.root, Platform: platform})
			must(t, err)
			if _, err := os.Stat(filepath.Join(tg.root, "etc")); platform == Linux && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("etc left after uninstall: %v", err)
			}
		})
	}
}

func TestErrorsSayWhatToDo(t *testing.T) {
	tg := newTarget(t, agentYAML)
	two := newTarget(t, agentYAML+`  - host: host-b
    pools:
      linux: {labels: [self-hosted, linux], slots: 2}
    backend:
      exec: {create: [/bin/true], stop: [/bin/true]}
`)
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"missing binary":      {Options{Root: tg.root, Platform: Linux, ConfigFrom: tg.cfg, Binary: "/opt/berth/berth"}, "install berth first"},
		"relative binary":     {Options{Root: tg.root, Platform: Linux, ConfigFrom: tg.cfg, Binary: "bin/berth"}, "absolute path"},
		"no config":           {Options{Root: tg.root, Platform: Linux}, "--config-from is required"},
		"missing config":      {Options{Root: tg.root, Platform: Linux, ConfigFrom: "/nonexistent.yaml"}, "--config-from"},
		"missing creds":       {Options{Root: tg.root, Platform: Linux, ConfigFrom: tg.cfg, CredsFrom: "/nonexistent.creds"}, "NATS credentials"},
		"unknown platform":    {Options{Root: tg.root, Platform: "windows", ConfigFrom: tg.cfg}, "--platform linux"},
		"unknown host":        {Options{Root: tg.root, Platform: Linux, ConfigFrom: tg.cfg, Host: "host-z"}, "not among the agents"},
		"several, no --host":  {Options{Root: two.root, Platform: Linux, ConfigFrom: two.cfg}, "pass --host"},
		"user that is absent": {Options{Root: tg.root, Platform: Linux, ConfigFrom: tg.cfg, User: "no-such-user-berth", Chown: true}, "useradd"},
	} {
		t.Run(name, func(t *testing.T) {
			before := tree(t, tc.o.Root)
			_, err := Install(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install = %v; want an error saying %q", err, tc.want)
			}
			if after := tree(t, tc.o.Root); !maps(before, after) {
				t.Errorf("a failed install wrote %v", keys(after))
			}
		})
	}
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Given a preview directory (--root DIR) that holds no berth binary, when
// an operator previews the install as its help shows, then it writes the
// files under DIR and notes that the binary must be installed on the
// host, instead of failing; a second preview writes nothing and says so.
func TestAPreviewNeedsNoBinaryUnderItsRoot(t *testing.T) {
	tg := newTarget(t, agentYAML)
	o := tg.opts(Linux)
	o.Binary = "/opt/nowhere/berth"
	o.Preview = true
	res, err := Install(o)
	if err != nil {
		t.Fatalf("preview without the binary under the root: %v", err)
	}
	if len(res.Written) == 0 || len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "/opt/nowhere/berth") {
		t.Fatalf("result %+v, want the files written and one note naming the binary", res)
	}
	for _, p := range res.Written {
		if _, err := os.Stat(filepath.Join(tg.root, p)); err != nil {
			t.Errorf("%s not under the root: %v", p, err)
		}
	}
	again, err := Install(o)
	must(t, err)
	if len(again.Written) != 0 || !slices.Equal(again.Unchanged, res.Written) {
		t.Errorf("second preview %+v: want nothing written and %v unchanged", again, res.Written)
	}
}

// Given a config copied from a checkout (a dispatcher section, an exec
// step named relative to the checkout) and no credentials, when it is
// installed, then the result says each of the three, with what to do; a
// config made for the host says nothing.
func TestInstallSaysWhatTheCopiedConfigLacksOnAHost(t *testing.T) {
	tg := newTarget(t, `dispatcher:
  webhook_secret: s3cret
agents:
  - host: host-a
    pools:
      linux: {labels: [self-hosted, linux], slots: 2}
    backend:
      exec: {create: [sh, ../install/install.go], stop: [/bin/true]}
`)
	o := tg.opts(Linux)
	o.CredsFrom = ""
	res, err := Install(o)
	must(t, err)
	all := strings.Join(res.Notes, "\n")
	for _, want := range []string{"also holds dispatcher", "../install/install.go", "/var/lib/berth", "no NATS credentials", "--creds-from"} {
		if !strings.Contains(all, want) {
			t.Errorf("notes lack %q:\n%s", want, all)
		}
	}
	clean := newTarget(t, agentYAML)
	res, err = Install(clean.opts(Linux))
	must(t, err)
	if len(res.Notes) != 0 {
		t.Errorf("a config made for the host got notes: %v", res.Notes)
	}
}
