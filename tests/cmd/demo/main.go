// Command demo runs the whole Berth system on one machine on the GitHub
// simulator: embedded NATS JetStream, the dispatcher, the watchdog and two
// vmagents with the exec backend, driven by signed webhooks built from real
// payloads. It prints live progress and a summary, and exits non-zero when
// any job was not served or any slot or VM is left at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
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
	flag.BoolVar(&keep, "keep", false, "keep the system running after the summary, for `nats` and `berth status` (Ctrl-C stops)")
	flag.StringVar(&logLevel, "log-level", "error", "service log level: debug, info, warn, error (warn shows demand waiting for slots)")
	flag.Parse()

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
	fmt.Printf("Berth demo: %d jobs over pools linux (4 slots/host) and macos (2 slots/host) on hosts host-a and host-b\n", o.Jobs)
	fmt.Println("building the simulated runner and starting NATS, dispatcher, watchdog, 2 agents and the GitHub simulator…")
	start := time.Now()
	f, err := harness.Start(ctx, o)
	if err != nil {
		fail(err, cleanup)
	}
	fmt.Printf("up in %s: NATS %s, dispatcher http://%s, GitHub simulator %s\n",
		time.Since(start).Round(100*time.Millisecond), f.Sys.NATSURL, f.Sys.DispatcherAddr, f.Sim.URL())
	rep, err := f.Drive(ctx, o)
	rep.Elapsed = time.Since(start)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
	}
	harness.PrintSummary(os.Stdout, rep, keep && err == nil)
	if keep && err == nil {
		fmt.Println("Ctrl-C stops it.")
		<-ctx.Done()
	}
	fmt.Println("stopping…")
	if serr := f.Stop(); serr != nil {
		fmt.Fprintln(os.Stderr, "demo: shutdown:", serr)
	}
	cleanup()
	if err != nil || !rep.OK() {
		os.Exit(1)
	}
	fmt.Println("stopped.")
}

func fail(err error, cleanup func()) {
	fmt.Fprintln(os.Stderr, "demo:", err)
	cleanup()
	os.Exit(1)
}
