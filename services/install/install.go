// Package install writes (and removes) what runs a vmagent as a service on
// one host: a systemd unit on Linux or a launchd daemon on macOS, the
// agent's config file and its NATS credentials. Everything is written under
// Options.Root ("/" on a real host, a temporary directory in tests), and
// only there; nothing is started unless the caller runs the commands a
// Result lists.
//
// Install is idempotent: running it twice leaves the same files. Uninstall
// removes exactly what Install wrote: the files, and the directories Install
// created (when empty), as recorded in a manifest next to the config.
package install

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/services/config"
)

// Platforms Install knows.
const (
	Linux  = "linux"
	Darwin = "darwin"
)

// Service names.
const (
	UnitName = "berth-agent.service"
	Label    = "ci.berth.agent"
)

// Default drain bounds, used when the config sets none: an agent's
// shutdown_timeout and its backend's stop_timeout (see services/config).
const (
	DefaultShutdownTimeout = 10 * time.Minute
	DefaultStopTimeout     = 2 * time.Minute
	// StopMargin is added to shutdown + stop before the service manager
	// kills the agent: time to append the last facts and exit.
	StopMargin = time.Minute
)

// Options say what to install where. Paths other than Root and the
// *From sources are absolute paths on the target host; they are written
// under Root.
type Options struct {
	// Root is the target file system's root; "" means "/".
	Root string
	// Platform is linux or darwin; "" means runtime.GOOS.
	Platform string
	// Binary is the berth executable the service runs; it must exist
	// (under Root). "" means /usr/local/bin/berth.
	Binary string
	// ConfigFrom is the agent config to install (required); ConfigPath
	// where it goes ("" means /etc/berth/agent.yaml on Linux,
	// /usr/local/etc/berth/agent.yaml on macOS).
	ConfigFrom, ConfigPath string
	// CredsFrom is the NATS credentials file to install (optional: without
	// it the agent connects without credentials); CredsPath where it goes
	// ("" means nats.creds beside the config). Written with mode 0600.
	CredsFrom, CredsPath string
	// Host picks agents[].host in the config; "" when it lists one agent.
	Host string
	// User runs the agent ("" means berth).
	User string
	// Chown gives the config, credentials and working directory to User;
	// for real installs run as root (User must exist then).
	Chown bool
	// Preview: Root is a directory to look at what would be written, not
	// the host's file system: the binary need not be under it (a note
	// says so instead).
	Preview bool
}

// Result lists what was done and what the operator should run next.
type Result struct {
	// Written are the files written (changed), Unchanged those found
	// already right, Removed the files and directories removed (host
	// paths, not under Root).
	Written, Unchanged, Removed []string
	// Notes say what the operator must still see to on the host (a
	// preview's binary that is not there yet).
	Notes []string
	// Commands to run on the host, in order, to (un)load the service.
	Commands [][]string
}

// layout is the resolved set of paths and settings.
type layout struct {
	o        Options
	service  string // unit or plist path
	workDir  string
	logDir   string // darwin only
	manifest string
	shutdown time.Duration
	stop     time.Duration
	notes    []string // configNotes, for Result.Notes
}

func (o Options) resolve() (*layout, error) {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Platform == "" {
		o.Platform = runtime.GOOS
	}
	if o.Binary == "" {
		o.Binary = "/usr/local/bin/berth"
	}
	if o.User == "" {
		o.User = "berth"
	}
	l := &layout{shutdown: DefaultShutdownTimeout, stop: DefaultStopTimeout}
	etc := "/etc/berth"
	switch o.Platform {
	case Linux:
		l.service = "/etc/systemd/system/" + UnitName
		l.workDir = "/var/lib/berth"
	case Darwin:
		etc = "/usr/local/etc/berth"
		l.service = "/Library/LaunchDaemons/" + Label + ".plist"
		l.workDir = "/usr/local/var/berth"
		l.logDir = "/usr/local/var/log/berth"
	default:
		return nil, fmt.Errorf("platform %q: use --platform linux (systemd) or darwin (launchd)", o.Platform)
	}
	if o.ConfigPath == "" {
		o.ConfigPath = etc + "/agent.yaml"
	}
	if o.CredsPath == "" {
		o.CredsPath = filepath.Join(filepath.Dir(o.ConfigPath), "nats.creds")
	}
	for flag, p := range map[string]string{"--binary": o.Binary, "--config": o.ConfigPath, "--creds": o.CredsPath} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%s %q: give an absolute path on the host (the service manager does not run in your directory)", flag, p)
		}
	}
	if strings.ContainsAny(o.User, " \t\n\"'\\<>&") || strings.ContainsAny(o.Host, " \t\n\"'\\<>&") {
		return nil, fmt.Errorf("--user %q / --host %q: use plain names", o.User, o.Host)
	}
	l.manifest = filepath.Join(filepath.Dir(o.ConfigPath), ".berth-agent-install")
	l.o = o
	return l, nil
}

// under maps a host path into Root.
func (l *layout) under(p string) string { return filepath.Join(l.o.Root, p) }

// readConfig checks the config to install and takes the drain bounds from
// it, so the service manager waits long enough for a drain to finish.
func (l *layout) readConfig() ([]byte, error) {
	if l.o.ConfigFrom == "" {
		return nil, errors.New("--config-from is required: give the agent config to install (deploy/berth.example.yaml documents one)")
	}
	b, err := os.ReadFile(l.o.ConfigFrom)
	if err != nil {
		return nil, fmt.Errorf("--config-from: %w", err)
	}
	c, err := config.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("--config-from %s: %w", l.o.ConfigFrom, err)
	}
	var hosts []string
	for _, a := range c.Agents {
		hosts = append(hosts, a.Host)
		if a.Host == l.o.Host || l.o.Host == "" && len(c.Agents) == 1 {
			l.notes = configNotes(b, c, l.o.CredsFrom != "", l.workDir)
			l.shutdown = a.ShutdownTimeout
			if st := a.Backend.Steps(); st != nil {
				l.stop = st.StopTimeout
			}
			return b, nil
		}
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("--config-from %s lists no agents: add an agents: entry for this host", l.o.ConfigFrom)
	}
	if l.o.Host == "" {
		return nil, fmt.Errorf("--config-from %s lists %d agents (%s): pass --host with this host's", l.o.ConfigFrom, len(hosts), strings.Join(hosts, ", "))
	}
	return nil, fmt.Errorf("--host %q is not among the agents in %s (%s): pass one of them, or add it to the config", l.o.Host, l.o.ConfigFrom, strings.Join(hosts, ", "))
}

// StopTimeout is how long the service manager lets the agent drain after
// SIGTERM before it kills it: the agent's shutdown_timeout (running jobs
// finish), then one stop_timeout (what is left is stopped), plus StopMargin.
func StopTimeout(shutdown, stop time.Duration) time.Duration { return shutdown + stop + StopMargin }

// args is the agent's command line.
func (l *layout) args() []string {
	a := []string{l.o.Binary, "agent", "--config", l.o.ConfigPath}
	if l.o.Host != "" {
		a = append(a, "--host", l.o.Host)
	}
	if l.o.CredsFrom != "" {
		a = append(a, "--nats-creds", l.o.CredsPath)
	}
	return a
}

// Unit returns the systemd unit for o (Linux), with the drain bounds given.
func Unit(o Options, shutdown, stop time.Duration) (string, error) {
	l, err := o.resolve()
	if err != nil {
		return "", err
	}
	l.shutdown, l.stop = shutdown, stop
	return l.unit(), nil
}

func (l *layout) unit() string {
	stopSec := int(StopTimeout(l.shutdown, l.stop).Seconds())
	var b strings.Builder
	fmt.Fprintf(&b, `# Berth vmagent: one per host. Written by `+"`berth agent install`"+`; the reference copy is
# deploy/systemd/berth-agent.service (a test keeps the two equal).
[Unit]
Description=Berth vmagent (ephemeral VMs for GitHub Actions jobs)
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
User=%s
ExecStart=%s
WorkingDirectory=%s
StateDirectory=berth
StateDirectoryMode=0700
Restart=always
RestartSec=5s
# SIGTERM drains the host: no new jobs, running jobs may finish for shutdown_timeout
# (%v), then what is left is stopped (stop_timeout %v). Only the agent gets SIGTERM
# (KillMode=mixed): the VMs it started are its to stop. SIGKILL for everything left
# comes after TimeoutStopSec = shutdown + stop + %v.
KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec=%d
LimitNOFILE=65536
UMask=0077
# Hardening that leaves VM tooling working: no PrivateDevices (/dev/kvm, /dev/net/tun),
# no PrivateTmp (paths handed to a container daemon), no NoNewPrivileges (sudo and setuid
# helpers in exec scripts), no ProtectHome (images kept in a home), no
# ProtectControlGroups (jailers), no MemoryDenyWriteExecute (emulators' JITs).
ProtectSystem=full
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectClock=yes
ProtectHostname=yes
RestrictRealtime=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
`, l.o.User, systemdArgs(l.args()), l.workDir, l.shutdown, l.stop, StopMargin, stopSec)
	return b.String()
}

// systemdArgs quotes a command line for ExecStart.
func systemdArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'\\;$%") {
			a = strconv.Quote(strings.ReplaceAll(strings.ReplaceAll(a, "%", "%%"), "$", "$$"))
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// Plist returns the launchd property list for o (macOS), with the drain
// bounds given.
func Plist(o Options, shutdown, stop time.Duration) (string, error) {
	l, err := o.resolve()
	if err != nil {
		return "", err
	}
	l.shutdown, l.stop = shutdown, stop
	return l.plist(), nil
}

func (l *layout) plist() string {
	esc := func(s string) string {
		var b bytes.Buffer
		_ = xml.EscapeText(&b, []byte(s))
		return b.String()
	}
	var args strings.Builder
	for _, a := range l.args() {
		fmt.Fprintf(&args, "\t\t<string>%s</string>\n", esc(a))
	}
	logFile := l.logDir + "/agent.log"
	return fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Berth vmagent: one per host. Written by berth agent install; the reference copy is
     deploy/launchd/ci.berth.agent.plist (a test keeps the two equal).
     SIGTERM drains the host: running jobs may finish for shutdown_timeout (%v), then what
     is left is stopped (stop_timeout %v); launchd sends SIGKILL after ExitTimeOut =
     shutdown + stop + %v. -->
<plist version="1.0">
<dict>
	<key>Label</key>
	<string>%s</string>
	<key>ProgramArguments</key>
	<array>
%s	</array>
	<key>UserName</key>
	<string>%s</string>
	<key>WorkingDirectory</key>
	<string>%s</string>
	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<true/>
	<key>ThrottleInterval</key>
	<integer>5</integer>
	<key>ExitTimeOut</key>
	<integer>%d</integer>
	<key>ProcessType</key>
	<string>Standard</string>
	<key>Umask</key>
	<integer>63</integer>
	<key>SoftResourceLimits</key>
	<dict>
		<key>NumberOfFiles</key>
		<integer>65536</integer>
	</dict>
	<key>StandardOutPath</key>
	<string>%s</string>
	<key>StandardErrorPath</key>
	<string>%s</string>
</dict>
</plist>
`, l.shutdown, l.stop, StopMargin, Label, args.String(), esc(l.o.User), esc(l.workDir),
		int(StopTimeout(l.shutdown, l.stop).Seconds()), esc(logFile), esc(logFile))
}

// file is one file Install writes.
type file struct {
	path string // host path
	data []byte
	mode os.FileMode
	own  bool // given to User with Chown
}

// owner is the uid and gid the agent's files go to with Chown, else -1.
func (l *layout) owner() (uid, gid int, err error) {
	if !l.o.Chown {
		return -1, -1, nil
	}
	u, err := user.Lookup(l.o.User)
	if err != nil {
		return -1, -1, fmt.Errorf("--user %s: %w (create it first: %s)", l.o.User, err, addUserHint(l.o.Platform, l.o.User))
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// checkBinary makes sure the service's binary is there: an error for a
// real install, a note in res for a preview (its root holds no binary).
func (l *layout) checkBinary(res *Result) error {
	fi, err := os.Stat(l.under(l.o.Binary))
	if err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0 {
		return nil
	}
	if l.o.Preview {
		res.Notes = append(res.Notes, fmt.Sprintf("--binary %s is not under %s: the service runs it, so install berth there on the host first (install -m 0755 bin/berth %s)",
			l.o.Binary, l.o.Root, l.o.Binary))
		return nil
	}
	return fmt.Errorf("--binary %s: no executable there (%v): install berth first (make build && install -m 0755 bin/berth %s), or pass --binary with where it is",
		l.o.Binary, errOr(err, "not an executable file"), l.o.Binary)
}

// Install writes the service definition, the config and the credentials,
// and returns the commands that load and start the service.
func Install(o Options) (*Result, error) {
	l, err := o.resolve()
	if err != nil {
		return nil, err
	}
	res := &Result{}
	if err := l.checkBinary(res); err != nil {
		return nil, err
	}
	cfg, err := l.readConfig()
	if err != nil {
		return nil, err
	}
	res.Notes = append(res.Notes, l.notes...)
	files := []file{{path: l.o.ConfigPath, data: cfg, mode: 0o600, own: true}}
	if l.o.CredsFrom != "" {
		creds, err := os.ReadFile(l.o.CredsFrom)
		if err != nil {
			return nil, fmt.Errorf("--creds-from: %w (give the NATS credentials made for this agent: its agent-HOST.nk from berth nats-auth, or a creds file from nsc generate creds)", err)
		}
		files = append(files, file{path: l.o.CredsPath, data: creds, mode: 0o600, own: true})
	}
	dirs := []string{l.workDir}
	if l.o.Platform == Linux {
		files = append(files, file{path: l.service, data: []byte(l.unit()), mode: 0o644})
		dirs = nil // systemd makes the StateDirectory
	} else {
		files = append(files, file{path: l.service, data: []byte(l.plist()), mode: 0o644})
		dirs = append(dirs, l.logDir)
	}
	uid, gid, err := l.owner()
	if err != nil {
		return nil, err
	}
	m, err := l.readManifest()
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		made, err := l.mkdirs(filepath.Dir(f.path))
		if err != nil {
			return nil, err
		}
		m.addDirs(made)
		changed, err := writeFile(l.under(f.path), f.data, f.mode)
		if err != nil {
			return nil, err
		}
		if f.own && uid >= 0 {
			if err := os.Chown(l.under(f.path), uid, gid); err != nil {
				return nil, err
			}
		}
		m.addFile(f.path)
		if changed {
			res.Written = append(res.Written, f.path)
		} else {
			res.Unchanged = append(res.Unchanged, f.path)
		}
	}
	for _, d := range dirs {
		made, err := l.mkdirs(d)
		if err != nil {
			return nil, err
		}
		m.addDirs(made)
		if uid >= 0 {
			if err := os.Chown(l.under(d), uid, gid); err != nil {
				return nil, err
			}
		}
	}
	if err := l.writeManifest(m); err != nil {
		return nil, err
	}
	res.Commands = l.loadCommands()
	return res, nil
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

func addUserHint(platform, name string) string {
	if platform == Darwin {
		return "sudo sysadminctl -addUser " + name + " -home /usr/local/var/berth, or pass --user with an existing account"
	}
	return "sudo useradd --system --home-dir /var/lib/berth --shell /usr/sbin/nologin " + name + ", or pass --user with an existing account"
}

func (l *layout) loadCommands() [][]string {
	if l.o.Platform == Linux {
		return [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", "--now", UnitName}}
	}
	// bootout first so that a second install loads the new definition.
	return [][]string{{"launchctl", "bootout", "system/" + Label}, {"launchctl", "bootstrap", "system", l.service}}
}

// StopCommands are what to run before Uninstall removes the files: stop the
// service (the agent drains) and unregister it.
func StopCommands(o Options) ([][]string, error) {
	l, err := o.resolve()
	if err != nil {
		return nil, err
	}
	if l.o.Platform == Linux {
		return [][]string{{"systemctl", "disable", "--now", UnitName}}, nil
	}
	return [][]string{{"launchctl", "bootout", "system/" + Label}}, nil
}

// Uninstall removes what Install wrote: the files it lists in its manifest
// (or, without one, the service definition, config and credentials at the
// paths o names) and the directories Install created, when empty. Run
// StopCommands first: on Linux, a unit still enabled is an error that says
// so. Result.Commands holds what to run after.
func Uninstall(o Options) (*Result, error) {
	l, err := o.resolve()
	if err != nil {
		return nil, err
	}
	if l.o.Platform == Linux {
		wants := "/etc/systemd/system/multi-user.target.wants/" + UnitName
		if _, err := os.Lstat(l.under(wants)); err == nil {
			return nil, fmt.Errorf("%s is enabled (%s exists): stop and disable it first with systemctl disable --now %s (the agent drains the host), or pass --now",
				UnitName, wants, UnitName)
		}
	}
	m, err := l.readManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Files) == 0 {
		m.Files = []string{l.service, l.o.ConfigPath, l.o.CredsPath}
	}
	res := &Result{}
	for _, f := range m.Files {
		err := os.Remove(l.under(f))
		if err == nil {
			res.Removed = append(res.Removed, f)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if err := os.Remove(l.under(l.manifest)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Deepest first; a directory someone else put files in stays.
	slices.SortFunc(m.Dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, d := range m.Dirs {
		if err := os.Remove(l.under(d)); err == nil {
			res.Removed = append(res.Removed, d)
		}
	}
	if l.o.Platform == Linux {
		res.Commands = [][]string{{"systemctl", "daemon-reload"}}
	}
	return res, nil
}

// manifest records what Install wrote, so Uninstall removes exactly that.
type manifest struct {
	Files, Dirs []string
}

func (m *manifest) addFile(p string) {
	if !slices.Contains(m.Files, p) {
		m.Files = append(m.Files, p)
	}
}

func (m *manifest) addDirs(ds []string) {
	for _, d := range ds {
		if !slices.Contains(m.Dirs, d) {
			m.Dirs = append(m.Dirs, d)
		}
	}
}

// The manifest is text: "file PATH" and "dir PATH" lines.
func (l *layout) readManifest() (*manifest, error) {
	b, err := os.ReadFile(l.under(l.manifest))
	m := &manifest{}
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		kind, p, _ := strings.Cut(line, " ")
		switch {
		case kind == "file" && filepath.IsAbs(p):
			m.Files = append(m.Files, p)
		case kind == "dir" && filepath.IsAbs(p):
			m.Dirs = append(m.Dirs, p)
		}
	}
	return m, nil
}

func (l *layout) writeManifest(m *manifest) error {
	var b strings.Builder
	b.WriteString("# written by berth agent install; berth agent uninstall removes these\n")
	for _, f := range m.Files {
		b.WriteString("file " + f + "\n")
	}
	for _, d := range m.Dirs {
		b.WriteString("dir " + d + "\n")
	}
	_, err := writeFile(l.under(l.manifest), []byte(b.String()), 0o600)
	return err
}

// mkdirs makes the host directory d (under Root) and its missing parents,
// returning the ones it made.
func (l *layout) mkdirs(d string) ([]string, error) {
	var made []string
	for p := d; p != "/" && p != "."; p = filepath.Dir(p) {
		if _, err := os.Stat(l.under(p)); err == nil {
			break
		}
		made = append(made, p)
	}
	if err := os.MkdirAll(l.under(d), 0o755); err != nil {
		return nil, err
	}
	return made, nil
}

// writeFile replaces path with data and mode atomically and reports
// whether it changed it; a file already equal is left alone (its mode
// corrected, which counts as no change).
func writeFile(path string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, os.Chmod(path, mode)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".berth-install-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), path)
}
