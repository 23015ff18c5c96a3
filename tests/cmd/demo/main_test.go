package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/testkit"
)

// TestMain runs the demo itself when asked (BERTH_DEMO_MAIN=1), so the
// tests drive the real command, signals and all, without building it.
func TestMain(m *testing.M) {
	if os.Getenv("BERTH_DEMO_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// demo is one demo process and what it printed so far.
type demo struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	out   strings.Builder
	lines chan string
	exit  chan error
}

// startDemo runs a busy demo: long jobs, more than the slots, giving up
// after timeout.
func startDemo(t *testing.T, timeout string) *demo {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-jobs", "80", "-arrival", "8s", "-min-duration", "4s", "-max-duration", "12s",
		"-nats-listen", "127.0.0.1:0", "-timeout", timeout, "-warm", "0")
	cmd.Env = append(os.Environ(), "BERTH_DEMO_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	d := &demo{cmd: cmd, lines: make(chan string, 1024), exit: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.mu.Lock()
			d.out.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			select {
			case d.lines <- sc.Text():
			default:
			}
		}
		close(d.lines)
		d.exit <- cmd.Wait()
	}()
	return d
}

func (d *demo) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

var progress = regexp.MustCompile(`queued\s+(\d+)\s+running\s+(\d+)\s+done\s+(\d+)/(\d+)`)

// busy waits for a progress line with jobs running and some done, and
// returns how many were done.
func (d *demo) busy(t *testing.T) int {
	t.Helper()
	deadline := time.After(4 * time.Minute)
	for {
		select {
		case line, ok := <-d.lines:
			if !ok {
				t.Fatalf("the demo ended before it was busy:\n%s", d.output())
			}
			if m := progress.FindStringSubmatch(line); m != nil {
				running, _ := strconv.Atoi(m[2])
				done, _ := strconv.Atoi(m[3])
				if running >= 4 && done >= 1 {
					return done
				}
			}
		case <-deadline:
			t.Fatalf("the demo was not busy within 4 minutes:\n%s", d.output())
		}
	}
}

// wait waits for the process to end within limit and returns its exit
// code and how long it took.
func (d *demo) wait(t *testing.T, limit time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-d.exit:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return d.cmd.ProcessState.ExitCode(), time.Since(start)
	case <-time.After(limit):
		t.Fatalf("the demo did not exit within %s of the interrupt:\n%s", limit, d.output())
	}
	return 0, 0
}

// Given a busy demo (jobs running, more queued), when it gets SIGINT, then
// it exits within 15 s with 130, having said what it waited for while
// stopping, and its summary tells what really happened: the jobs served
// (at least those done before the interrupt, fewer than all), the ones
// left unfinished, RESULT: INTERRUPTED, and no advice to debug a failure.
func TestABusyDemoStopsWithinSecondsOfCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo (about a minute)")
	}
	d := startDemo(t, "3m")
	doneBefore := d.busy(t)
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code, took := d.wait(t, 15*time.Second)
	out := d.output()
	t.Logf("exited %d, %s after SIGINT", code, took.Round(100*time.Millisecond))
	if code != 130 {
		t.Errorf("exit code %d, want 130 (interrupted)", code)
	}
	m := regexp.MustCompile(`jobs served:\s+(\d+) of (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary:\n%s", out)
	}
	served, _ := strconv.Atoi(m[1])
	if served < doneBefore || served >= 80 {
		t.Errorf("summary says %d of 80 served; %d were done before the interrupt and the demo was busy", served, doneBefore)
	}
	n := regexp.MustCompile(`jobs not served:\s+(\d+) \((\d+) unfinished: (\d+) queued, (\d+) running\)`).FindStringSubmatch(out)
	if n == nil {
		t.Fatalf("the summary does not say which jobs were left unfinished:\n%s", out)
	}
	notServed, _ := strconv.Atoi(n[1])
	unfinished, _ := strconv.Atoi(n[2])
	if served+notServed != 80 || unfinished == 0 || unfinished > notServed {
		t.Errorf("summary: %d served, %d not served, %d unfinished; want them to add up to the 80 jobs, some unfinished", served, notServed, unfinished)
	}
	t.Logf("summary: %d served, %d unfinished when interrupted", served, unfinished)
	// It said where everything listens (the watchdog, each agent, the page)
	// and what those addresses answer: their / is a 404.
	for _, want := range []string{"watchdog http://127.0.0.1:", "host-a http://127.0.0.1:", "host-b http://127.0.0.1:",
		"GET /healthz and /metrics", "the fleet at a glance, live in a browser: http://127.0.0.1:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"RESULT: INTERRUPTED", "unfinished", "stopped everything in"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--log-level debug") {
		t.Errorf("an interrupted run is no failure to debug:\n%s", out)
	}
}

// Given a demo stopping after a first SIGINT, when a second one comes,
// then it exits at once (within 2 s) with 130, saying what it leaves.
func TestASecondCtrlCExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo (about a minute)")
	}
	d := startDemo(t, "3m")
	d.busy(t)
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(15 * time.Second)
	for seen := false; !seen; {
		select {
		case line := <-d.lines:
			seen = strings.Contains(line, "Ctrl-C again exits at once")
		case <-deadline:
			t.Fatalf("no word of the interrupt:\n%s", d.output())
		}
	}
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code, took := d.wait(t, 2*time.Second)
	t.Logf("exited %d, %s after the second SIGINT", code, took.Round(10*time.Millisecond))
	if code != 130 || !strings.Contains(d.output(), "interrupted again: exiting now") {
		t.Errorf("exit %d, want 130 with word of what is left:\n%s", code, d.output())
	}
	// No simulated runner outlives it: each ran a binary under the data
	// directory it names.
	m := regexp.MustCompile(`left behind: (\S+) `).FindStringSubmatch(d.output())
	if m == nil {
		t.Fatalf("no data directory named:\n%s", d.output())
	}
	defer os.RemoveAll(m[1]) // what it left, as it says, is the user's to remove: the test's here
	// A SIGKILLed process leaves /proc within moments, not at once.
	testkit.Eventually(t, 2*time.Second, "no runner process left after the second Ctrl-C", func() bool { return len(running(m[1])) == 0 })
}

// running lists the live processes whose binary is under dir.
func running(dir string) []string {
	procs, _ := os.ReadDir("/proc")
	var out []string
	for _, p := range procs {
		exe, err := os.Readlink("/proc/" + p.Name() + "/exe")
		if err == nil && strings.HasPrefix(exe, dir+"/") {
			out = append(out, p.Name()+" "+exe)
		}
	}
	return out
}

// Given a busy demo whose -timeout ends before its jobs do, then it gives
// up, summarises what happened (RESULT: TIMED OUT, with the jobs left
// unfinished) and exits 1 within 30 s of giving up, not after the agents'
// ten-minute drain.
func TestADemoEndingOnItsTimeoutStopsWithinSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo (about a minute)")
	}
	d := startDemo(t, "10s")
	deadline := time.After(4 * time.Minute)
	for seen := false; !seen; {
		select {
		case line, ok := <-d.lines:
			if !ok {
				t.Fatalf("the demo ended without timing out:\n%s", d.output())
			}
			seen = strings.Contains(line, "timed out after 10s")
		case <-deadline:
			t.Fatalf("the demo did not time out:\n%s", d.output())
		}
	}
	code, took := d.wait(t, 30*time.Second)
	out := d.output()
	t.Logf("exited %d, %s after giving up", code, took.Round(100*time.Millisecond))
	if code != 1 || !strings.Contains(out, "RESULT: TIMED OUT") || !regexp.MustCompile(`\d+ unfinished: \d+ queued, \d+ running`).MatchString(out) {
		t.Errorf("exit %d; want 1 with a summary of the timed-out run:\n%s", code, out)
	}
}

// Found by a new user: every demo that ended by itself printed
// "interrupted: summarising what happened" (the signal context's cleanup
// looked like a Ctrl-C). Given a short demo, when it serves its jobs, then
// it exits 0 with RESULT: OK and says nothing of an interrupt, and it
// counts no VM alive at the end (each VM was counted in the fold and on
// disk).
func TestADemoThatEndsByItselfWasNotInterrupted(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-jobs", "6", "-arrival", "1s", "-min-duration", "200ms", "-max-duration", "400ms",
		"-nats-listen", "127.0.0.1:0", "-timeout", "3m", "-warm", "0")
	cmd.Env = append(os.Environ(), "BERTH_DEMO_MAIN=1")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the demo did not end within 4 minutes:\n%s", out)
	}
	if err != nil || !strings.Contains(string(out), "RESULT: OK") {
		t.Fatalf("the demo: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "interrupted") {
		t.Errorf("a demo that ended by itself says it was interrupted:\n%s", out)
	}
	if !strings.Contains(string(out), "VMs alive at the end:   0") {
		t.Errorf("VMs alive at the end is not 0:\n%s", out)
	}
	// Found by a new user: the first progress line counted one host's
	// slots (linux x/4) before the second host had registered.
	first := regexp.MustCompile(`(?m)^\[[0-9:]+\] queued.*$`).FindString(string(out))
	if !regexp.MustCompile(`linux \d+/8, macos \d+/4`).MatchString(first) {
		t.Errorf("the first progress line does not count both hosts' slots (linux of 8, macos of 4): %q", first)
	}
}
