package ec2

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"text/template"

	"github.com/berth-ci/berth/services/vmagent/backend"
)

// UserDataFields is what the user-data template is rendered with.
type UserDataFields struct {
	Attempt   string   // attempt id: the runner's name and the instance's Name tag
	Pool      string   // pool name
	Host      string   // the agent's host name
	Fleet     string   // berth:fleet tag value
	Labels    []string // runner labels
	LabelsCSV string   // the same, comma-separated
	JobID     int64    // the job the attempt was booked for (the runner may take another)
	// JITConfig is the encoded JIT runner configuration as GitHub returns
	// it (base64 text, no newline), for `run.sh --jitconfig`; empty for a
	// warm instance's first boot, which must power off (warm.go).
	JITConfig string
	// Warm: the instance is a warm VM (AssignByRestart).
	Warm bool
}

// DefaultUserData is the user-data template used when none is configured:
// a shell script (run by cloud-init as root at first boot) for an image
// with a user "runner" and the Actions runner unpacked in
// /home/runner/actions-runner. It writes the JIT config to a 0600 file,
// runs one ephemeral runner, and powers off when it exits; the backend
// launches with InstanceInitiatedShutdownBehavior=terminate, so the power-off
// terminates the instance even before the agent's Stop.
const DefaultUserData = `#!/bin/bash
# Berth attempt {{.Attempt}} (pool {{.Pool}}, fleet {{.Fleet}}, job {{.JobID}})
set -eu
{{- if not .JITConfig}}
# A warm instance's first boot: ready; power off (stopped) until Berth
# writes the JIT config into this user data and starts it again.
shutdown -h now
exit 0
{{- end}}
umask 077
install -d -m 0700 -o runner /run/berth
cat > /run/berth/jitconfig <<'BERTH_JIT_CONFIG'
{{.JITConfig}}
BERTH_JIT_CONFIG
chown runner /run/berth/jitconfig
cd /home/runner/actions-runner
runuser -u runner -- ./run.sh --jitconfig "$(cat /run/berth/jitconfig)" || true
shutdown -h now
`

// MaxUserData is EC2's limit on user data, before base64 encoding.
const MaxUserData = 16 << 10

// jitRE: a JIT config is base64 text; anything else (a newline, a quote)
// could break out of the script it is pasted into.
var jitRE = regexp.MustCompile(`^[A-Za-z0-9+/=_-]+$`)

func parseUserData(text string) (*template.Template, error) {
	t, err := template.New("user_data").Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("ec2 backend: user data template: %w", err)
	}
	// Render once with sample values, so that a template naming a field
	// that does not exist fails when the agent starts, not at the first job.
	var buf bytes.Buffer
	if err := t.Execute(&buf, UserDataFields{Attempt: "berth-1-1", Pool: "p", Host: "h", Fleet: "f", Labels: []string{"l"},
		LabelsCSV: "l", JobID: 1, JITConfig: "e30="}); err != nil {
		return nil, fmt.Errorf("ec2 backend: user data template: %w (fields: .Attempt .Pool .Host .Fleet .Labels .LabelsCSV .JobID .JITConfig .Warm)", err)
	}
	return t, nil
}

// renderUserData takes the attempt's JIT config (in memory, as an
// InMemoryJIT backend gets it, or from its file; none for a warm VM's
// first boot) and renders the template.
func (b *Backend) renderUserData(vm backend.VM) ([]byte, error) {
	jit := ""
	if len(vm.JITConfig) > 0 {
		jit = strings.TrimSpace(string(vm.JITConfig))
		if !jitRE.MatchString(jit) {
			return nil, fmt.Errorf("the JIT config is not base64 text (%d bytes)", len(jit))
		}
	} else if vm.JITConfigFile != "" {
		raw, err := os.ReadFile(vm.JITConfigFile)
		if err != nil {
			return nil, fmt.Errorf("read the JIT config: %w", err)
		}
		jit = strings.TrimSpace(string(raw))
		if !jitRE.MatchString(jit) {
			return nil, fmt.Errorf("the JIT config in %s is not base64 text (%d bytes)", vm.JITConfigFile, len(jit))
		}
	} else if !vm.Warm {
		return nil, errors.New("no JIT config for a VM that is not warm")
	}
	var buf bytes.Buffer
	if err := b.userData.Execute(&buf, UserDataFields{
		Attempt: vm.Attempt, Pool: vm.Pool, Host: vm.Host, Fleet: b.opts.Fleet, Labels: vm.Labels,
		LabelsCSV: strings.Join(vm.Labels, ","), JobID: vm.JobID, JITConfig: jit, Warm: vm.Warm,
	}); err != nil {
		return nil, fmt.Errorf("render user data: %w", err)
	}
	if buf.Len() > MaxUserData {
		return nil, fmt.Errorf("user data is %d bytes; EC2 takes at most %d before base64 (shorten the template)", buf.Len(), MaxUserData)
	}
	return buf.Bytes(), nil
}
