// Command bench runs Berth's benchmark suite (issue 9): throughput, dispatch
// latency, release latency with wedged teardowns, memory per job, replay
// and scale, each beside a reference measured in the same run, plus the Go
// benchmarks of the fold, label matching and placement. It prints a table
// and, unless -no-write, appends a dated section to BENCHMARKS.md.
//
//	go run ./tests/cmd/bench            # the full run (make bench)
//	go run ./tests/cmd/bench -smoke     # tiny sizes, under a minute (make bench-smoke)
//
// It exits non-zero, with what it was waiting for, when a phase stalls or
// overruns its deadline.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-ci/berth/tests/bench"
)

type sizes struct {
	tpJobs, tpHosts                int
	rates                          string
	latWindow                      time.Duration
	latMaxJobs, latHosts           int
	relJobs, relHosts              int
	relRate                        float64
	memWarmup, memJobs             int
	replayJobs                     int
	scaleHosts, scaleJobs          int
	scaleLinux, scaleMac           int
	scaleProbes                    int
	scaleDuration, scaleHeartbeat  time.Duration
	warmJobs, warmHosts, warmVMs   int
	warmRate                       float64
	warmBoot                       time.Duration
	goBenchTime                    string
	phaseTimeout, stall, goTimeout time.Duration
}

var full = sizes{
	tpJobs: 2000, tpHosts: 4,
	rates: "50,200,1000", latWindow: 4 * time.Second, latMaxJobs: 2000, latHosts: 4,
	relJobs: 300, relHosts: 4, relRate: 50,
	memWarmup: 300, memJobs: 1500,
	replayJobs: 20000,
	scaleHosts: 40, scaleJobs: 600, scaleLinux: 16, scaleMac: 8, scaleProbes: 100, scaleDuration: 20 * time.Second,
	warmJobs: 200, warmHosts: 2, warmVMs: 4, warmRate: 10, warmBoot: 2 * time.Second,
	goBenchTime: "1s", phaseTimeout: 4 * time.Minute, stall: 45 * time.Second, goTimeout: 8 * time.Minute,
}

var smoke = sizes{
	tpJobs: 100, tpHosts: 2,
	rates: "50,200,1000", latWindow: 500 * time.Millisecond, latMaxJobs: 100, latHosts: 2,
	relJobs: 30, relHosts: 2, relRate: 50,
	memWarmup: 30, memJobs: 60,
	replayJobs: 1000,
	scaleHosts: 8, scaleJobs: 60, scaleLinux: 8, scaleMac: 4, scaleProbes: 10, scaleDuration: 3 * time.Second,
	warmJobs: 20, warmHosts: 1, warmVMs: 2, warmRate: 20, warmBoot: 500 * time.Millisecond,
	goBenchTime: "20x", phaseTimeout: 45 * time.Second, stall: 20 * time.Second, goTimeout: 3 * time.Minute,
}

// options are the command line's choices other than the sizes.
type options struct {
	isSmoke, noWrite, goBench, bareLabel bool
	hookSenders, worldProcs              int
	jitFile, scaleOneProcess             bool
	heapOwners                           bool
	heapRate                             int
	out, only, cpuProfile                string
	heapDir, logLevel, asCmd             string
	scaleProfile                         string
	replayProfile                        string
	scaleTrace                           string
	seed                                 uint64
}

// phase is one phase of the suite: its name (for -phases), the sizes it
// runs at (for the section), and how to run it.
type phase struct {
	name, size string
	run        func() (bench.Result, error)
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "world" {
		serveWorld(os.Args[2])
		return
	}
	began := time.Now()
	o, s := parseFlags()
	if o.heapOwners {
		// Every allocation from here on is sampled (or one each
		// -heap-owners-rate bytes), so the memory phase's heap profiles
		// part the retained heap exactly (and slowly), or estimate it.
		runtime.MemProfileRate = max(1, o.heapRate)
	}
	mode := "full"
	if o.isSmoke {
		mode = "smoke"
	}

	root, err := bench.RepoRoot()
	check(err)
	fixtures, err := bench.FixturesDir(root)
	check(err)
	if o.out == "" {
		o.out = filepath.Join(root, "BENCHMARKS.md")
	}
	var lvl slog.Level
	check(lvl.UnmarshalText([]byte(o.logLevel)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	env := bench.Env{Fixtures: fixtures, Seed: o.seed, Timeout: s.phaseTimeout, Stall: s.stall, BareLabel: o.bareLabel, Unloaded: &bench.Unloaded{},
		HookSenders: o.hookSenders, JITFile: o.jitFile,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})),
		Progress: func(format string, args ...any) {
			fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		}}
	if !o.scaleOneProcess {
		exe, err := os.Executable()
		check(err)
		env.World, env.WorldProcs = []string{exe, "world"}, o.worldProcs
	}
	want := map[string]bool{}
	for _, p := range strings.Split(o.only, ",") {
		want[strings.TrimSpace(p)] = true
	}
	phases := phaseList(ctx, env, o, s)
	m := bench.Describe(root)
	loadBefore := bench.LoadAvg()
	fmt.Printf("Berth bench (%s) on %s, %s, %d cores; %s; commit %s; load average %s\n", mode, m.Uname, m.CPU, m.Cores, m.Go, m.Commit, loadBefore)
	results, sizesDone := runPhases(phases, want, o.out)
	var profile, gobench string
	if o.cpuProfile != "" && want["throughput"] {
		profile, err = pprofTop(ctx, root, o.cpuProfile)
		check(err)
	}
	if o.goBench {
		fmt.Printf("[%s] go benchmarks (-benchtime %s)\n", time.Now().Format("15:04:05"), s.goBenchTime)
		gobench, err = goBenchmarks(ctx, root, s.goBenchTime, s.goTimeout)
		check(err)
	}
	printResults(results, gobench)
	if o.noWrite {
		return
	}
	sec := bench.Section{When: began, Mode: mode, Machine: m, Command: commandLine(o.asCmd), Sizes: sizesDone, Results: results,
		GoBench: gobench, Profile: profile, Duration: time.Since(began), LoadBefore: loadBefore, LoadAfter: bench.LoadAvg()}
	check(bench.AppendMarkdown(o.out, sec))
	fmt.Println("\nappended to", o.out)
}

// serveWorld is the bench binary's `world` mode: the scale phase's
// simulator and agents in a process of their own (bench.ServeWorld),
// started by the bench with its config as the one argument. It ends when
// its stdin closes.
func serveWorld(config string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.ServeWorld(ctx, config, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench world:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line. With -smoke, the smoke sizes replace
// the full ones except where a size flag was given explicitly.
func parseFlags() (options, sizes) {
	var o options
	s := full
	flag.BoolVar(&o.isSmoke, "smoke", false, "tiny sizes (under a minute): the CI smoke run; explicit size flags still win")
	flag.BoolVar(&o.noWrite, "no-write", false, "print the table only; do not append to BENCHMARKS.md")
	flag.BoolVar(&o.goBench, "gobench", true, "also run the Go benchmarks (events, dispatch, watchdog) with -benchmem")
	flag.StringVar(&o.out, "out", "", "file to append the section to (default BENCHMARKS.md at the repository root)")
	flag.StringVar(&o.only, "phases", "throughput,latency,release,memory,replay,scale,warm", "phases to run, comma-separated")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the throughput phase here and put its top 15 in the section")
	flag.StringVar(&o.scaleProfile, "scale-cpuprofile", "", "write a CPU profile of the scale phase's probe window here")
	flag.StringVar(&o.replayProfile, "replay-cpuprofile", "", "write a CPU profile of each replay round here, with .1 and .2 added")
	flag.StringVar(&o.scaleTrace, "scale-trace", "", "write an execution trace of the scale phase's probe window here (go tool trace)")
	flag.StringVar(&o.heapDir, "heapprofiles", "", "write heap profiles into this directory: before and after the memory phase's jobs, and the scale phase's idle and full fleet")
	flag.StringVar(&o.logLevel, "log-level", "error", "services' log level (to stderr): debug, info, warn, error")
	flag.StringVar(&o.asCmd, "invoked-as", "", "the command to record in BENCHMARKS.md (the Makefile sets it)")
	flag.Uint64Var(&o.seed, "seed", 1, "workload seed")
	flag.BoolVar(&o.heapOwners, "heap-owners", false, "sample every allocation, so the memory phase parts the retained heap by owner (Berth, NATS, simulator); slow: use with -phases memory")
	flag.IntVar(&o.heapRate, "heap-owners-rate", 1, "with -heap-owners: sample one allocation each this many bytes on average (runtime.MemProfileRate); above 1 the parts are the profile's estimates, and a run of 100,000 jobs takes minutes, not an hour")
	flag.BoolVar(&o.jitFile, "jit-file", false, "the bench's VMs read their JIT configs from the files the agents write, as exec and vz do (default: in memory, as ec2 does)")
	flag.IntVar(&o.hookSenders, "hook-senders", 8, "webhook deliveries the simulator has in flight at once, each job's in order (GitHub delivers concurrently; 1: one at a time, in order)")
	flag.IntVar(&o.worldProcs, "scale-world-procs", 1, "scale: cores (GOMAXPROCS) of the world process, which stands for GitHub and every host: at 1 its collector cannot take the control plane's core too (0: every core)")
	flag.BoolVar(&o.scaleOneProcess, "scale-one-process", false, "run the scale phase's simulator and agents in this process, beside the control plane, as runs before 2026-12-06 did (their heap then shares its collector)")
	flag.BoolVar(&o.bareLabel, "bare-label", false, "add jobs whose runs-on is just \"self-hosted\" (runners of either pool may take them)")
	sizeFlags(&s)
	flag.Parse()
	if o.isSmoke {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		s = merge(smoke, s, set)
	}
	return o, s
}

// sizeFlags registers one flag per size, defaulting to the full run's.
func sizeFlags(s *sizes) {
	flag.IntVar(&s.tpJobs, "throughput-jobs", s.tpJobs, "throughput: jobs")
	flag.IntVar(&s.tpHosts, "throughput-hosts", s.tpHosts, "throughput: hosts")
	flag.StringVar(&s.rates, "rates", s.rates, "dispatch latency: offered rates, jobs/s")
	flag.DurationVar(&s.latWindow, "latency-window", s.latWindow, "dispatch latency: how long each rate is offered")
	flag.IntVar(&s.latMaxJobs, "latency-max-jobs", s.latMaxJobs, "dispatch latency: cap on jobs per rate")
	flag.IntVar(&s.latHosts, "latency-hosts", s.latHosts, "dispatch latency: hosts")
	flag.IntVar(&s.relJobs, "release-jobs", s.relJobs, "release latency: jobs per run")
	flag.IntVar(&s.relHosts, "release-hosts", s.relHosts, "release latency: hosts")
	flag.Float64Var(&s.relRate, "release-rate", s.relRate, "release latency: offered jobs/s")
	flag.IntVar(&s.memWarmup, "memory-warmup", s.memWarmup, "memory: warm-up jobs")
	flag.IntVar(&s.memJobs, "memory-jobs", s.memJobs, "memory: measured jobs")
	flag.IntVar(&s.replayJobs, "replay-jobs", s.replayJobs, "replay: synthetic job lifecycles (ten facts each)")
	flag.IntVar(&s.scaleHosts, "scale-hosts", s.scaleHosts, "scale: hosts")
	flag.IntVar(&s.scaleLinux, "scale-linux-slots", s.scaleLinux, "scale: linux slots per host")
	flag.IntVar(&s.scaleMac, "scale-mac-slots", s.scaleMac, "scale: macos slots per host")
	flag.IntVar(&s.scaleJobs, "scale-jobs", s.scaleJobs, "scale: jobs, all enqueued at once and running together")
	flag.IntVar(&s.scaleProbes, "scale-probes", s.scaleProbes, "scale: jobs offered at the unloaded latency rate while the others run")
	flag.DurationVar(&s.scaleDuration, "scale-duration", s.scaleDuration, "scale: each job's duration; must cover filling the fleet and the probes")
	flag.DurationVar(&s.scaleHeartbeat, "scale-heartbeat", s.scaleHeartbeat, "scale: each agent's heartbeat (0: the agents' default, 5s; the other phases beat every 1s)")
	flag.IntVar(&s.warmJobs, "warm-jobs", s.warmJobs, "time to runner: linux jobs")
	flag.IntVar(&s.warmVMs, "warm-vms", s.warmVMs, "time to runner: warm VMs kept in the linux pool")
	flag.DurationVar(&s.warmBoot, "warm-boot", s.warmBoot, "time to runner: every VM's boot time")
	flag.StringVar(&s.goBenchTime, "gobench-time", s.goBenchTime, "Go benchmarks: -benchtime")
	flag.DurationVar(&s.phaseTimeout, "phase-timeout", s.phaseTimeout, "deadline of each phase's main wait")
	flag.DurationVar(&s.stall, "stall", s.stall, "fail a phase when its log does not move for this long")
}

// phaseList is every phase at the chosen sizes, in the order they run: the
// latency phase comes before scale, which compares with its unloaded
// figure.
func phaseList(ctx context.Context, env bench.Env, o options, s sizes) []phase {
	var rates []int
	for _, r := range strings.Split(s.rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		check(err)
		rates = append(rates, n)
	}
	return []phase{
		{"throughput", fmt.Sprintf("throughput %d jobs on %d hosts", s.tpJobs, s.tpHosts), func() (bench.Result, error) {
			return bench.Throughput(ctx, env, bench.ThroughputOptions{Jobs: s.tpJobs, Hosts: s.tpHosts, CPUProfile: o.cpuProfile})
		}},
		{"latency", fmt.Sprintf("dispatch latency at %s jobs/s for %s each (at most %d jobs) on %d hosts", s.rates, s.latWindow, s.latMaxJobs, s.latHosts), func() (bench.Result, error) {
			return bench.DispatchLatency(ctx, env, bench.LatencyOptions{Rates: rates, Window: s.latWindow, MaxJobs: s.latMaxJobs, Hosts: s.latHosts})
		}},
		{"release", fmt.Sprintf("release latency %d jobs at %.0f/s on %d hosts", s.relJobs, s.relRate, s.relHosts), func() (bench.Result, error) {
			return bench.ReleaseLatency(ctx, env, bench.ReleaseOptions{Jobs: s.relJobs, Hosts: s.relHosts, Rate: s.relRate})
		}},
		{"memory", fmt.Sprintf("memory %d warm-up + %d jobs", s.memWarmup, s.memJobs), func() (bench.Result, error) {
			return bench.Memory(ctx, env, bench.MemoryOptions{Warmup: s.memWarmup, Jobs: s.memJobs, HeapProfileDir: o.heapDir, HeapOwners: o.heapOwners,
				AfterFirstSnapshots: !o.isSmoke})
		}},
		{"replay", fmt.Sprintf("replay %d lifecycles", s.replayJobs), func() (bench.Result, error) {
			return bench.Replay(ctx, env, bench.ReplayOptions{Jobs: s.replayJobs, CPUProfile: o.replayProfile})
		}},
		{"warm", fmt.Sprintf("time to runner %d jobs at %.0f/s on %d hosts, %d warm VMs, boot %s", s.warmJobs, s.warmRate, s.warmHosts, s.warmVMs, s.warmBoot), func() (bench.Result, error) {
			return bench.TimeToRunner(ctx, env, bench.WarmOptions{Jobs: s.warmJobs, Hosts: s.warmHosts, Warm: s.warmVMs, Rate: s.warmRate, Boot: s.warmBoot})
		}},
		{"scale", fmt.Sprintf("scale %d jobs of %s on %d hosts of %d linux + %d macos slots", s.scaleJobs, s.scaleDuration, s.scaleHosts, s.scaleLinux, s.scaleMac), func() (bench.Result, error) {
			return bench.Scale(ctx, env, bench.ScaleOptions{Hosts: s.scaleHosts, Jobs: s.scaleJobs, Duration: s.scaleDuration,
				LinuxSlots: s.scaleLinux, MacSlots: s.scaleMac, Probes: s.scaleProbes, Heartbeat: s.scaleHeartbeat, CPUProfile: o.scaleProfile, Trace: o.scaleTrace, HeapProfileDir: o.heapDir})
		}},
	}
}

// runPhases runs the wanted phases in order. A failed phase ends the run
// (exit 1) after printing what the earlier ones measured, and nothing is
// written: a section with a phase missing would read as a complete run.
func runPhases(phases []phase, want map[string]bool, out string) (results []bench.Result, sizesDone []string) {
	for _, p := range phases {
		if !want[p.name] {
			continue
		}
		start := time.Now()
		r, err := p.run()
		if err != nil {
			bench.PrintTable(os.Stdout, results)
			fmt.Fprintf(os.Stderr, "bench: phase %s failed after %s: %v\n", p.name, time.Since(start).Round(time.Millisecond), err)
			fmt.Fprintln(os.Stderr, "bench: nothing written to", out)
			os.Exit(1)
		}
		r.Elapsed = time.Since(start)
		results = append(results, r)
		sizesDone = append(sizesDone, p.size)
		fmt.Printf("[%s] %s done in %s\n", time.Now().Format("15:04:05"), p.name, r.Elapsed.Round(100*time.Millisecond))
	}
	return results, sizesDone
}

// printResults prints the table, its notes, and the Go benchmarks' result
// lines.
func printResults(results []bench.Result, gobench string) {
	fmt.Println()
	bench.PrintTable(os.Stdout, results)
	fmt.Println()
	bench.PrintNotes(os.Stdout, results)
	if gobench != "" {
		fmt.Println()
		for _, l := range strings.Split(gobench, "\n") {
			if strings.HasPrefix(l, "Benchmark") || strings.HasPrefix(l, "pkg:") {
				fmt.Println(l)
			}
		}
	}
}

// commandLine is the command the section records: -invoked-as when the
// Makefile gave it, else this one as typed.
func commandLine(asCmd string) string {
	if asCmd != "" {
		return asCmd
	}
	cmd := "go run ./tests/cmd/bench"
	if len(os.Args) > 1 {
		cmd += " " + strings.Join(os.Args[1:], " ")
	}
	return cmd
}

// merge takes the smoke sizes except where a flag was given explicitly.
func merge(small, given sizes, set map[string]bool) sizes {
	s := small
	pick := func(name string, dst any, v any) {
		if !set[name] {
			return
		}
		switch d := dst.(type) {
		case *int:
			*d = v.(int)
		case *float64:
			*d = v.(float64)
		case *string:
			*d = v.(string)
		case *time.Duration:
			*d = v.(time.Duration)
		}
	}
	pick("throughput-jobs", &s.tpJobs, given.tpJobs)
	pick("throughput-hosts", &s.tpHosts, given.tpHosts)
	pick("rates", &s.rates, given.rates)
	pick("latency-window", &s.latWindow, given.latWindow)
	pick("latency-max-jobs", &s.latMaxJobs, given.latMaxJobs)
	pick("latency-hosts", &s.latHosts, given.latHosts)
	pick("release-jobs", &s.relJobs, given.relJobs)
	pick("release-hosts", &s.relHosts, given.relHosts)
	pick("release-rate", &s.relRate, given.relRate)
	pick("memory-warmup", &s.memWarmup, given.memWarmup)
	pick("memory-jobs", &s.memJobs, given.memJobs)
	pick("replay-jobs", &s.replayJobs, given.replayJobs)
	pick("warm-jobs", &s.warmJobs, given.warmJobs)
	pick("warm-vms", &s.warmVMs, given.warmVMs)
	pick("warm-boot", &s.warmBoot, given.warmBoot)
	pick("scale-hosts", &s.scaleHosts, given.scaleHosts)
	pick("scale-jobs", &s.scaleJobs, given.scaleJobs)
	pick("scale-duration", &s.scaleDuration, given.scaleDuration)
	pick("scale-linux-slots", &s.scaleLinux, given.scaleLinux)
	pick("scale-mac-slots", &s.scaleMac, given.scaleMac)
	pick("scale-probes", &s.scaleProbes, given.scaleProbes)
	pick("scale-heartbeat", &s.scaleHeartbeat, given.scaleHeartbeat)
	pick("gobench-time", &s.goBenchTime, given.goBenchTime)
	pick("phase-timeout", &s.phaseTimeout, given.phaseTimeout)
	pick("stall", &s.stall, given.stall)
	return s
}

// goBenchmarks runs the Go benchmarks of the fold, label matching and the
// two deciders with allocation counts.
func goBenchmarks(ctx context.Context, root, benchtime string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", benchtime,
		"./events/", "./services/dispatch/", "./services/watchdog/")
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go benchmarks: %v\n%s", err, b)
	}
	return "$ go test -run '^$' -bench . -benchmem -benchtime " + benchtime + " ./events/ ./services/dispatch/ ./services/watchdog/\n" + string(b), nil
}

func pprofTop(ctx context.Context, root, profile string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=15", profile)
	cmd.Dir = root
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %v", err)
	}
	return string(b), nil
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
