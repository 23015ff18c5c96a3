package main

import (
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// execStep implements the exec backend's contract (services/vmagent/
// backends/exec) for the simulator's runner, as deploy/exec/sim-runner.sh
// does, without a shell: the compose agent's image is FROM scratch.
//
//	ghsim exec create|stop|list    (or BERTH_STEP)
//
// create starts `ghsim runner --jitconfig-file $BERTH_JIT_CONFIG_FILE` in a
// session of its own (it outlives the step) and writes its pid to
// $BERTH_WORK_DIR/runner.pid; stop sends SIGTERM, then SIGKILL after 5 s;
// list prints the attempts under $BERTH_ATTEMPTS_DIR whose runner is alive.
// Run under an init that reaps orphans (compose: `init: true`).
func execStep(args []string) error {
	step := os.Getenv("BERTH_STEP")
	if len(args) > 0 {
		step = args[0]
	}
	switch step {
	case "list":
		dir := os.Getenv("BERTH_ATTEMPTS_DIR")
		if dir == "" {
			return errors.New("exec list: BERTH_ATTEMPTS_DIR is not set")
		}
		pidfiles, _ := filepath.Glob(filepath.Join(dir, "*", "runner.pid"))
		for _, f := range pidfiles {
			if pid, err := readPID(f); err == nil && alive(pid) {
				fmt.Println(filepath.Base(filepath.Dir(f)))
			}
		}
		return nil
	case "create":
		work, jit := os.Getenv("BERTH_WORK_DIR"), os.Getenv("BERTH_JIT_CONFIG_FILE")
		if work == "" || jit == "" {
			return errors.New("exec create: BERTH_WORK_DIR and BERTH_JIT_CONFIG_FILE must be set (run it as the agent's exec backend)")
		}
		if pid, err := readPID(filepath.Join(work, "runner.pid")); err == nil && alive(pid) {
			return nil // a retried create: the runner runs
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		logf, err := os.Create(filepath.Join(work, "runner.log"))
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd := osexec.Command(self, "runner", "--jitconfig-file", jit)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives the step and its deadline's kill
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("exec create: start runner: %w", err)
		}
		if err := os.WriteFile(filepath.Join(work, "runner.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
			return err
		}
		return cmd.Process.Release()
	case "stop":
		pid, err := readPID(filepath.Join(os.Getenv("BERTH_WORK_DIR"), "runner.pid"))
		if err != nil || !alive(pid) {
			return nil // never started, or its runner finished its job and exited
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return nil
	}
	return fmt.Errorf("exec: unknown step %q (want create, stop or list)", step)
}

func readPID(file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// alive: the process exists and is not a zombie (an exited runner not yet
// reaped still answers signal 0).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
