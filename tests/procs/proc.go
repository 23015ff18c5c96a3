package procs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is one child process that can be killed and started again with the
// same command line; its output goes to one file across restarts.
type Proc struct {
	Name string
	Log  string // path of its output file

	argv []string
	env  []string // on top of the test's environment
	dir  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	state    *os.ProcessState
	starts   int
	expected bool // the last exit was asked for (Kill) or awaited (AwaitExit)
}

func newProc(name, logPath, dir string, env []string, argv ...string) *Proc {
	return &Proc{Name: name, Log: logPath, dir: dir, env: env, argv: argv}
}

// start runs the command with env added to the base environment; a
// variable named in env replaces the inherited one.
func (p *Proc) start(env []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.exitedLocked() {
		return fmt.Errorf("%s is running", p.Name)
	}
	out, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the child holds its own descriptor
	p.starts++
	fmt.Fprintf(out, "=== procs: start %d of %s at %s (env %v)\n", p.starts, p.Name, time.Now().Format("15:04:05.000"), env)
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Dir = p.dir
	cmd.Env = mergeEnv(os.Environ(), append(append([]string{}, p.env...), env...))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.state, p.expected = cmd, done, nil, false
	go func() {
		_ = cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// mergeEnv returns base with every KEY=VALUE of extra set (replacing base's),
// and with crash points never inherited from the test's environment.
func mergeEnv(base, extra []string) []string {
	keys := map[string]bool{"BERTH_CRASH_AT": true}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	var out []string
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

func (p *Proc) exitedLocked() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !p.exitedLocked()
}

// Pid is the process id of the current run (0 before the first start).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL to the process's group and waits (up to 10 s) for it.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.expected = true
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s (pid %d) did not die within 10s of SIGKILL", p.Name, cmd.Process.Pid)
	}
}

// Restart starts the process again (after Kill or an exit) with env on top
// of its own environment.
func (p *Proc) Restart(t testing.TB, env ...string) {
	t.Helper()
	if err := p.start(env); err != nil {
		t.Fatal(err)
	}
}

// AwaitExit waits up to within for the process to exit and returns how.
func (p *Proc) AwaitExit(t testing.TB, within time.Duration) *os.ProcessState {
	t.Helper()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		t.Fatalf("%s never started", p.Name)
	}
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("%s did not exit within %s; its log ends:\n%s", p.Name, within, tail(p.Log, 40))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expected = true
	return p.state
}

// Unexpected returns a description of the exit if the process exited
// without being killed or awaited, else "".
func (p *Proc) Unexpected() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || !p.exitedLocked() || p.expected {
		return ""
	}
	return fmt.Sprintf("%s exited on its own: %v", p.Name, p.state)
}

// KilledBySIGKILL reports whether a process state is a death by SIGKILL.
func KilledBySIGKILL(st *os.ProcessState) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// logMarkers are what a service logs when it skips, refuses or parks a
// fact, or a reaction panics: a failed system test prints each such line
// from the whole log, since the last lines rarely hold them.
var logMarkers = [][]byte{[]byte("skipping event"), []byte("refused"), []byte("parked"), []byte("reacting to an event failed")}

// marked is the first n lines of the file at path that hold any of
// markers, or "".
func marked(path string, markers [][]byte, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var out [][]byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		for _, m := range markers {
			if bytes.Contains(line, m) {
				out = append(out, line)
				break
			}
		}
		if len(out) == n {
			break
		}
	}
	return string(bytes.Join(out, []byte("\n")))
}
