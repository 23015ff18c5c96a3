package scenario

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// Law 4 (BL-11's re-placement): given a job's first attempt whose runner
// never registers and whose stop is held open, when the job is placed
// again, then attempt 2 gets its own work dir, disk and JIT config; when
// attempt 1's late teardown finally runs, it removes attempt 1's files and
// VM only, and attempt 2's runner, files and VM are untouched and it
// finishes the job.
func TestAReplacementGetsDisjointFilesAndALateTeardownOfAttempt1LeavesAttempt2Intact(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Watchdog.RegistrationTimeout = 2 * time.Second
		c.Watchdog.TeardownTimeout = 30 * time.Second
		execOf(&c.Agents[0]).StopTimeout = 30 * time.Second
	})
	w.fault("host-a", "create-no-runner", "berth-*-1")
	w.fault("host-a", "stop-hang", "berth-*-1")

	j := w.enqueue(linuxLabels, 4*time.Second)
	a1, a2 := events.AttemptID(j, 1), events.AttemptID(j, 2)
	w.await("attempt 2 runs the job", 20*time.Second, func() bool {
		v := w.job(j)
		return v.Status == "in_progress" && v.RunnerName == a2
	})
	w.await("attempt 1's teardown is in flight", 5*time.Second, func() bool { return w.calls("host-a", "stop", a1).inFlight() })

	d1, d2 := w.attemptDir("host-a", a1), w.attemptDir("host-a", a2)
	if d1 == d2 || strings.HasPrefix(d2, d1+string(filepath.Separator)) || strings.HasPrefix(d1, d2+string(filepath.Separator)) {
		t.Fatalf("attempt dirs overlap: %s and %s", d1, d2)
	}
	disk1, jit1 := readFile(t, d1, "disk.img"), readFile(t, d1, "jitconfig")
	disk2, jit2 := readFile(t, d2, "disk.img"), readFile(t, d2, "jitconfig")
	pid2 := readFile(t, d2, "runner.pid")
	if strings.TrimSpace(string(disk1)) != a1 || strings.TrimSpace(string(disk2)) != a2 {
		t.Errorf("disks name %q and %q, want each attempt's own", disk1, disk2)
	}
	if len(jit1) == 0 || bytes.Equal(jit1, jit2) {
		t.Error("the two attempts share a JIT config: a runner registration is not per attempt")
	}
	if vms := w.vms("host-a"); !slices.Equal(vms, []string{a1, a2}) {
		t.Errorf("backend inventory %v, want both attempts' VMs", vms)
	}

	w.release("host-a", a1) // attempt 1's teardown returns late
	w.awaitFact(events.TypeAttemptStopped, a1, 10*time.Second)
	if _, err := os.Stat(d1); !os.IsNotExist(err) {
		t.Errorf("attempt 1's dir survived its teardown: %v", err)
	}
	for name, want := range map[string][]byte{"disk.img": disk2, "jitconfig": jit2, "runner.pid": pid2} {
		if got := readFile(t, d2, name); !bytes.Equal(got, want) {
			t.Errorf("attempt 1's teardown changed attempt 2's %s: %q → %q", name, want, got)
		}
	}
	if !w.runnerAlive("host-a", a2) {
		t.Error("attempt 1's teardown killed attempt 2's runner")
	}
	if vms := w.vms("host-a"); !slices.Equal(vms, []string{a2}) {
		t.Errorf("backend inventory after attempt 1's teardown %v, want [%s]", vms, a2)
	}

	w.await("attempt 2 finished the job", 15*time.Second, w.jobIs(j, "completed"))
	if v := w.job(j); v.Conclusion != "success" || v.RunnerName != a2 || v.Completions != 1 {
		t.Errorf("job ended %q on %q (%d completions), want success on %s once", v.Conclusion, v.RunnerName, v.Completions, a2)
	}
	w.awaitFact(events.TypeAttemptStopped, a2, 10*time.Second)
	w.await("the host is empty", 5*time.Second, func() bool { return len(w.vms("host-a")) == 0 })
	w.stoppedExactlyOnce("host-a", a1)
	w.stoppedExactlyOnce("host-a", a2)
	w.checkLedger()
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return b
}
