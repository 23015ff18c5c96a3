// Command demo runs the whole Berth system on one machine on the GitHub
// simulator: embedded NATS JetStream, the dispatcher, the watchdog and two
// vmagents with the exec backend, driven by signed webhooks built from real
// payloads. It prints live progress and a summary, and exits non-zero when
// any job was not served or any slot or VM is left at the end.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-ci/berth/tests/harness"
)

func main() {
	var o harness.Options
	var keep bool
	var logLevel string
	flag.IntVar(&o.Jobs, "jobs", 200, "jobs to run")
	flag.IntVar(&o.Warm, "warm", 2, "warm VMs kept ready in the linux pool (0: none; the summary splits warm hits from cold starts)")
	flag.Float64Var(&o.MacOSShare, "macos-share", 0.3, "fraction of jobs for the macos pool")
	flag.DurationVar(&o.MinDuration, "min-duration", 300*time.Millisecond, "shortest job")
	flag.DurationVar(&o.MaxDuration, "max-duration", 2*time.Second, "longest job")
	flag.DurationVar(&o.Arrival, "arrival", 20*time.Second, "jobs arrive spread over this long")
	flag.Float64Var(&o.FailShare, "fail-share", 0.1, "fraction of jobs that fail (they are still served)")
	flag.Uint64Var(&o.Seed, "seed", 1, "workload seed")
	flag.StringVar(&o.DataDir, "data", "", "data directory (default: a fresh temporary one)")
	flag.StringVar(&o.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS address (127.0.0.1:0 for any free port)")
	flag.DurationVar(&o.Timeout, "timeout", 4*time.Minute, "give up waiting after this long")
	flag.BoolVar(&keep, "keep", false, "keep the system running after the summary, for the nats CLI and berth status (Ctrl-C stops)")
	flag.StringVar(&logLevel, "log-level", "error", "service log level: debug, info, warn, error (warn shows demand waiting for slots)")
	scaleSets := flag.String("scale-set-pools", "macos", "pools served through runner scale sets, comma-separated (\"\": every pool through webhooks); the summary splits queue times by intake")
	flag.Parse()
	if *scaleSets != "" {
		o.ScaleSetPools = strings.Split(*scaleSets, ",")
	}

	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(logLevel))
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	o.Progress = os.Stdout
	cleanup := func() {}
	if o.DataDir == "" {
		dir, err := os.MkdirTemp("", "berth-demo-")
		if err != nil {
			fail(err, cleanup)
		}
		cleanup = func() { os.RemoveAll(dir) }
		o.DataDir = dir
	}
	o.DataDir, _ = filepath.Abs(o.DataDir)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first Ctrl-C stops the run and the system (within seconds,
	// saying what it waits for); a second one exits at once.
	// Listening before saying so: a second Ctrl-C sent on reading either
	// line that promises it must find the handler there, whichever of the
	// two goroutines says it first.
	var armOnce sync.Once
	arm := func() { armOnce.Do(func() { secondInterruptExits(o.DataDir) }) }
	var summarised atomic.Bool // a -keep run's summary is out: Ctrl-C only stops
	unwatch := context.AfterFunc(ctx, func() {
		arm()
		if summarised.Load() {
			fmt.Println("\ninterrupted: stopping (Ctrl-C again exits at once)")
			return
		}
		fmt.Println("\ninterrupted: summarising what happened, then stopping (Ctrl-C again exits at once)")
	})
	// Runs before stop (defers run last first): a run that ends by itself
	// was not interrupted, though stop then cancels ctx.
	defer unwatch()
	fmt.Printf("Berth demo: %d jobs over pools linux (4 slots/host) and macos (2 slots/host) on hosts host-a and host-b\n", o.Jobs)
	if len(o.ScaleSetPools) > 0 {
		fmt.Printf("jobs reach Berth through a runner scale set for %s, through webhooks for the other pools (-scale-set-pools)\n",
			strings.Join(o.ScaleSetPools, ", "))
	}
	fmt.Println("building the simulated runner (`go build ./tests/cmd/ghsim`: a minute on a cold build cache) and starting NATS, dispatcher, watchdog, 2 agents and the GitHub simulator…")
	start := time.Now()
	f, err := harness.Start(ctx, o)
	if err != nil {
		fail(err, cleanup)
	}
	fmt.Printf("up in %s: NATS %s, dispatcher http://%s, watchdog http://%s, agents %s, GitHub simulator %s\n",
		time.Since(start).Round(100*time.Millisecond), f.Sys.NATSURL, f.Sys.DispatcherAddr, f.Sys.WatchdogAddr, agents(f), f.Sim.URL())
	fmt.Println("  (each service answers GET /healthz and /metrics, the dispatcher and the watchdog also /status; the simulator answers GitHub's REST paths)")
	fmt.Printf("the fleet at a glance, live in a browser: http://%s/\n", f.Sys.PageAddr)
	rep, err := f.Drive(ctx, o)
	rep.Elapsed = time.Since(start)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
	}
	harness.PrintSummary(os.Stdout, rep, keep && err == nil && !rep.Interrupted)
	if keep && err == nil && !rep.Interrupted {
		summarised.Store(true)
		fmt.Println("Ctrl-C stops it.")
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		arm() // the interrupt's own line said Ctrl-C again exits
		fmt.Println("stopping…")
	} else {
		unwatch() // a Ctrl-C from here on is no interrupt of the run
		arm()
		fmt.Println("stopping… (Ctrl-C exits at once)")
	}
	if serr := stopShowingProgress(f); serr != nil {
		fmt.Fprintln(os.Stderr, "demo: shutdown:", serr)
	}
	cleanup()
	switch {
	case rep.Interrupted:
		fmt.Println("stopped.")
		os.Exit(130)
	case err != nil || !rep.OK():
		os.Exit(1)
	}
	fmt.Println("stopped.")
}

// agents lists the agents' addresses (their /healthz and /metrics).
func agents(f *harness.Fleet) string {
	var out []string
	for host, addr := range f.Sys.AgentAddrs {
		out = append(out, host+" http://"+addr)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// secondInterruptExits makes the next Ctrl-C (or SIGTERM) end the process
// at once, saying what it leaves behind.
func secondInterruptExits(dataDir string) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		// Agents go on starting runners until the exit. A runner is
		// started through sh and setsid, and between setsid and its exec
		// it is no child of ours nor runs a binary under dataDir: no
		// round can see it, and it would outlive us. So first its binary
		// moves away, and every later exec of it fails; then kill until
		// two rounds, a moment apart, find none left.
		bin := harness.SimRunnerDir(dataDir)
		_ = os.Rename(bin, bin+".stopped")
		n, empty := 0, 0
		for round := 0; round < 20 && empty < 2; round++ {
			k := killRunners(dataDir)
			if n += k; k == 0 {
				empty++
				time.Sleep(50 * time.Millisecond) // an exec begun before the move ends
			} else {
				empty = 0
			}
		}
		fmt.Fprintf(os.Stderr, "\ninterrupted again: exiting now without waiting; killed %d runner process(es); left behind: %s (remove it: rm -rf %s)\n",
			n, dataDir, dataDir)
		os.Exit(130)
	}()
}

// parent is pid's parent process id from /proc (0 when unreadable).
func parent(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid …": comm may hold spaces, so read after ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// killRunners SIGKILLs every process running a binary under dataDir (the
// simulated runners the agents started, each in its own process group,
// which goes with it) and every child of ours (a runner being started),
// so exiting at once leaves no runner behind. It
// reads /proc: elsewhere it kills nothing and returns 0.
func killRunners(dataDir string) int {
	procs, _ := os.ReadDir("/proc")
	own := syscall.Getpgrp()
	n := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", p.Name(), "exe"))
		// A runner an agent is starting is our child still running our
		// own binary until its exec: it must go too, or it outlives us.
		if err != nil || (!strings.HasPrefix(exe, dataDir+string(filepath.Separator)) && parent(pid) != os.Getpid()) {
			continue
		}
		if pg, err := syscall.Getpgid(pid); err == nil && pg != own {
			_ = syscall.Kill(-pg, syscall.SIGKILL)
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// stopShowingProgress stops the fleet, saying every 2 s what it still
// waits for.
func stopShowingProgress(f *harness.Fleet) error {
	done := make(chan error, 1)
	go func() { done <- f.Stop() }()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	began := time.Now()
	for {
		select {
		case err := <-done:
			fmt.Printf("stopped everything in %s\n", time.Since(began).Round(100*time.Millisecond))
			return err
		case <-t.C:
			fmt.Printf("stopping (%s): waiting for %s (agents stop the VMs still running; each stop is bounded)\n",
				time.Since(began).Round(time.Second), strings.Join(f.Sys.Running(), ", "))
		}
	}
}

func fail(err error, cleanup func()) {
	fmt.Fprintln(os.Stderr, "demo:", err)
	cleanup()
	os.Exit(1)
}
