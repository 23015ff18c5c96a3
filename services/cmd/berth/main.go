// Command berth runs Berth's services and is the operator's tool.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // warm-pool schedules name time zones; scratch images have no zoneinfo

	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/logx"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/services/run"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// Exit codes: 0 ok, 1 the operation failed, 2 bad usage or config, 3 NATS
// unreachable.
const (
	exitFailed = 1
	exitUsage  = 2
	exitNATS   = 3
)

type usageError struct{ error }
type natsError struct{ error }

// readError classifies an error reading the log: a truncated log is a
// failure (exit 1) with its own explanation, anything else NATS's (exit 3).
func readError(err error) error {
	if errors.Is(err, eventlog.ErrTruncated) {
		return err
	}
	return natsError{err}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root().ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, errorText(err))
	os.Exit(exitCode(err))
}

// errorText is what main prints for err: the error, and for a command or
// flag berth does not know, where the known ones are listed (a new user's
// typo otherwise ends with no next step).
func errorText(err error) string {
	s := "berth: " + err.Error()
	switch msg := err.Error(); {
	case unknownCommand(err):
		s += "\nrun `berth --help` to list the commands"
	case (strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "unknown shorthand flag")) && !strings.Contains(msg, "--help"):
		s += "\nrun `berth COMMAND --help` to list a command's flags"
	}
	return s
}

// exitCode is the README's exit code for a command's error.
func exitCode(err error) int {
	var ue usageError
	var ne natsError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue), unknownCommand(err):
		return exitUsage
	case errors.As(err, &ne):
		return exitNATS
	}
	return exitFailed
}

func root() *cobra.Command {
	var natsURL, logLevel, logFormat, natsNKey string
	cmd := &cobra.Command{
		Use:           "berth",
		Short:         "Ephemeral VMs for GitHub Actions jobs, over an event log in NATS JetStream",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			logger, err := logx.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return usageError{err}
			}
			slog.SetDefault(logger)
			if err := checkNATSURL(natsURL); err != nil {
				return usageError{err}
			}
			run.ClientNKey, run.ClientCreds = natsNKey, os.Getenv("BERTH_NATS_CREDS")
			return nil
		},
	}
	def := os.Getenv("BERTH_NATS_URL")
	if def == "" {
		def = "nats://127.0.0.1:4222"
	}
	cmd.SetFlagErrorFunc(flagError)
	cmd.PersistentFlags().StringVar(&natsURL, "nats", def, "NATS server URL (env BERTH_NATS_URL)")
	cmd.PersistentFlags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.PersistentFlags().StringVar(&natsNKey, "nats-nkey", os.Getenv("BERTH_NATS_NKEY"),
		"nkey seed file to connect to NATS with, e.g. cli.nk from berth nats-auth (env BERTH_NATS_NKEY; BERTH_NATS_CREDS for a creds file)")
	format := os.Getenv("BERTH_LOG_FORMAT")
	if format == "" {
		format = logx.FormatAuto
	}
	cmd.PersistentFlags().StringVar(&logFormat, "log-format", format,
		"auto (text on a terminal, JSON otherwise), json or text; secrets are redacted in all (env BERTH_LOG_FORMAT)")
	cmd.AddCommand(trustCmd(&natsURL))
	cmd.AddCommand(devCmd(), serviceCmd("dispatcher", &natsURL), serviceCmd("watchdog", &natsURL), agentCmd(&natsURL),
		statusCmd(&natsURL), eventsCmd(&natsURL), replayCmd(&natsURL),
		hostActionCmd(&natsURL, "cordon", "Stop placing new jobs on a host (running jobs go on)"),
		hostActionCmd(&natsURL, "uncordon", "Let a cordoned or draining host take new jobs again (alias: undrain)"),
		hostActionCmd(&natsURL, "drain", "Take a host out of service: no new jobs, idle runners are stopped, running jobs finish (berth uncordon HOST undoes it)"),
		hostsCmd(&natsURL), jobsCmd(&natsURL), releaseCmd(&natsURL), natsAuthCmd(), streamCmd(&natsURL))
	cmd.AddCommand(vzGuestCmd(), vzImportTartCmd())
	cmd.SetHelpCommand(helpCmd(cmd))
	strictUsage(cmd)
	return cmd
}

// helpCmd is cobra's `help [command]` except that an unknown topic is bad
// usage (exit 2, with where the known ones are listed): cobra's own prints
// the root's usage and exits 0, so a typo looked like success to scripts.
func helpCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 || target == nil {
				return usageError{fmt.Errorf("unknown help topic %q; run `berth --help` to list the commands", strings.Join(args, " "))}
			}
			target.InitDefaultHelpFlag()
			return target.Help()
		},
	}
}

// strictUsage makes every mistake in a command line a usage error (exit
// 2): a bad flag, and positional arguments a command does not take (they
// were accepted in silence: `berth status extra`).
func strictUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(flagError)
	for _, c := range cmd.Commands() {
		if c.Args == nil && c.Runnable() && !c.HasSubCommands() {
			c.Args = exactArgs(0)
		}
		strictUsage(c)
	}
}

// unknownCommand reports cobra's error for a subcommand it does not know:
// cobra gives it no type, only its text ("unknown command %q for %q",
// spf13/cobra command.go), so this is the one place Berth reads it.
func unknownCommand(err error) bool { return strings.HasPrefix(err.Error(), "unknown command ") }

// exactArgs is cobra.ExactArgs reporting a usage error (exit 2).
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if n == 0 && len(args) > 0 && cmd.HasAvailableSubCommands() {
			// cobra runs a command that has subcommands and its own RunE
			// for an unknown word, and would only count arguments.
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, c.Name())
				}
			}
			return usageError{fmt.Errorf("%s has no command %q: its commands are %s (see %s --help)",
				cmd.CommandPath(), args[0], strings.Join(names, ", "), cmd.CommandPath())}
		}
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError{fmt.Errorf("%w (see berth %s --help)", err, cmd.Name())}
		}
		return nil
	}
}

func loadConfig(path string) (*config.Config, error) {
	c, err := config.Load(path)
	if err != nil {
		return nil, usageError{err}
	}
	if c.NATS.NKeyFile == "" && c.NATS.CredsFile == "" && run.ClientNKey != "" {
		// --nats-nkey (BERTH_NATS_NKEY) serves the services as it serves the
		// tools, where the config names no credential of its own.
		c.NATS.NKeyFile = run.ClientNKey
	}
	return c, nil
}

func devCmd() *cobra.Command {
	var cfgPath, listen string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system in one process around an embedded nats-server",
		Example: `  berth dev --config deploy/berth.dev.yaml
  nats --server nats://127.0.0.1:4222 stream info BERTH_EVENTS   # in another terminal`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			if listen != "" {
				c.NATS.Listen = listen
			}
			c.NATS.URL = ""
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			sys, err := run.Dev(ctx, c, slog.Default())
			if err != nil {
				cancel()
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "berth dev: NATS %s, webhooks http://%s/webhook, watchdog http://%s/healthz; Ctrl-C stops\n",
				sys.NATSURL, sys.DispatcherAddr, sys.WatchdogAddr)
			if sys.PageAddr != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "berth dev: the fleet at a glance: http://%s/\n", sys.PageAddr)
			}
			return waitFor(ctx, cancel, sys)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "deploy/berth.dev.yaml", "config file")
	cmd.Flags().StringVar(&listen, "nats-listen", "", "embedded NATS client address (default from config, 127.0.0.1:4222)")
	return cmd
}

// waitFor runs until the signal context ends or a service fails, then stops
// everything and returns the services' errors.
func waitFor(ctx context.Context, cancel context.CancelFunc, sys *run.System) error {
	defer cancel()
	select {
	case <-ctx.Done():
	case <-sys.Failed():
	}
	cancel()
	return sys.Wait()
}

func serviceCmd(name string, natsURL *string) *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:     name,
		Short:   "Run the " + name + " against an external NATS",
		Example: "  berth " + name + " --config /etc/berth/berth.yaml --nats nats://nats:4222",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			if c.NATS.URL == "" || natsGiven(cmd) {
				c.NATS.URL = *natsURL
			}
			sys := run.NewSystem()
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if name == "dispatcher" {
				_, _, err = run.Dispatcher(ctx, sys, c, slog.Default())
			} else {
				_, _, err = run.Watchdog(ctx, sys, c, slog.Default())
			}
			if err != nil {
				return err
			}
			return waitFor(ctx, cancel, sys)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "/etc/berth/berth.yaml", "config file")
	if name == "dispatcher" {
		cmd.AddCommand(dispatcherKeyCmd())
	}
	return cmd
}

func agentCmd(natsURL *string) *cobra.Command {
	var cfgPath, host, creds string
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run one host's vmagent against an external NATS (install it as a service: berth agent install)",
		Example: `  berth agent --config /etc/berth/agent.yaml --host mac-mini-01
  sudo berth agent install --config-from ./agent.yaml --creds-from ./agent.creds --host linux-01 --now`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			if c.NATS.URL == "" || natsGiven(cmd) {
				c.NATS.URL = *natsURL
			}
			if creds != "" {
				c.NATS.CredsFile = creds
			}
			for _, a := range c.Agents {
				if host == "" && len(c.Agents) == 1 || a.Host == host {
					sys := run.NewSystem()
					ctx, cancel := context.WithCancel(cmd.Context())
					defer cancel()
					if _, err := run.Agent(ctx, sys, c, a, slog.Default()); err != nil {
						return err
					}
					return waitFor(ctx, cancel, sys)
				}
			}
			return usageError{fmt.Errorf("no agent for host %q in %s: pass --host with one of the agents' host names", host, cfgPath)}
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "/etc/berth/agent.yaml", "config file")
	cmd.Flags().StringVar(&host, "host", "", "which agents[].host to run (needed when the file lists several)")
	cmd.Flags().StringVar(&creds, "nats-creds", os.Getenv("BERTH_NATS_CREDS"), "NATS credentials file (overrides nats.creds_file; env BERTH_NATS_CREDS)")
	cmd.AddCommand(agentInstallCmd(), agentUninstallCmd())
	return cmd
}

func statusCmd(natsURL *string) *cobra.Command {
	var asJSON, watch bool
	var cfgPath string
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show pools (capacity, held, running, demand, abandoned VMs, alarms) and hosts",
		Long: "status replays the event log and reads agent heartbeats; it needs only NATS.\n" +
			"Held slots are listed beside the attempts that account for them.",
		Example: `  berth status
  berth status --json | jq '.pools[] | {name, capacity, held}'
  berth status --watch            # redraws every 2 s until Ctrl-C`,
		RunE: func(cmd *cobra.Command, args []string) error {
			url := *natsURL
			if cfgPath != "" && !natsGiven(cmd) {
				// The config names the server it describes, as it does for
				// the services and stream apply; --nats still wins.
				c, err := loadConfig(cfgPath)
				if err != nil {
					return err
				}
				if c.NATS.URL != "" {
					url = c.NATS.URL
				}
			}
			closeNC, js, err := run.JetStream(url)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			if watch {
				if every < 100*time.Millisecond {
					return usageError{fmt.Errorf("--every %s: give at least 100ms", every)}
				}
				out := cmd.OutOrStdout()
				f, isFile := out.(*os.File)
				tty := isFile && func() bool { st, err := f.Stat(); return err == nil && st.Mode()&os.ModeCharDevice != 0 }()
				if err := cli.WatchStatus(cmd.Context(), js, out, every, asJSON, tty && !asJSON); err != nil {
					return readError(err)
				}
				return nil
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			st, err := cli.FleetStatus(ctx, js)
			if err != nil {
				return readError(err)
			}
			if cfgPath != "" {
				c, err := loadConfig(cfgPath)
				if err != nil {
					return err
				}
				if st.StreamDrift, err = run.StreamDrift(ctx, js, c); err != nil {
					return natsError{err}
				}
			}
			return cli.PrintStatus(cmd.OutOrStdout(), st, asJSON, time.Now())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the stable contract)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print again every --every until interrupted (folds only new facts)")
	cmd.Flags().DurationVar(&every, "every", 2*time.Second, "interval for --watch")
	cmd.Flags().StringVar(&cfgPath, "config", "", "config file whose nats section the stream is compared with (stream_drift); its nats.url is used unless --nats is given")
	return cmd
}

func eventsCmd(natsURL *string) *cobra.Command {
	var asJSON, follow bool
	var f cli.Filter
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the event log, optionally for one job, pool, host or attempt",
		Example: `  berth events --job 4242
  berth events --pool macos --follow
  berth events --attempt berth-4242-1 --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.Validate(); err != nil {
				return usageError{err}
			}
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			return cli.Tail(cmd.Context(), js, f, follow, asJSON, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one CloudEvents JSON envelope per line")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	cmd.Flags().Int64Var(&f.Job, "job", 0, "GitHub job id")
	cmd.Flags().StringVar(&f.Pool, "pool", "", "pool name")
	cmd.Flags().StringVar(&f.Host, "host", "", "host name")
	cmd.Flags().StringVar(&f.Attempt, "attempt", "", "attempt id (runner name)")
	for flag, kind := range map[string]string{"job": nameJob, "pool": namePool, "host": nameHost, "attempt": nameAttempt} {
		_ = cmd.RegisterFlagCompletionFunc(flag, completeNames(natsURL, kind))
	}
	return cmd
}

func replayCmd(natsURL *string) *cobra.Command {
	var (
		asJSON, check bool
		seq           uint64
		at            string
		services      []string
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Rebuild the fleet from the log as of a sequence or a time; --check compares live services with it",
		Long: "replay folds the event log from the start into a fresh projection, exactly as a restarted\n" +
			"service does, and prints it like `berth status`. It is the operator's tool for \"rebuild stuck\n" +
			"state\": with --check it asks each running service for its live projection (GET /status)\n" +
			"and prints every difference from a replay up to the same sequence; it exits 1 when any differs.\n" +
			"Once the stream's retention limits have dropped old facts, it starts from the newest dispatcher or\n" +
			"watchdog snapshot (KV bucket berth_snapshots) that covers them and says so; when none does, it\n" +
			"says what is missing and exits 1 rather than print a fleet without those facts. Progress goes to\n" +
			"stderr: a redrawn bar on a terminal, a line every 5 s otherwise.",
		Example: `  berth replay                         # the fleet now, from the log alone
  berth replay --seq 120000            # as it was at stream sequence 120000
  berth replay --at 2026-11-30T09:00:00Z
  berth replay --check --service http://127.0.0.1:8080 --service http://127.0.0.1:8081`,
		RunE: func(cmd *cobra.Command, args []string) error {
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			bar := cli.NewProgress(cmd.ErrOrStderr())
			if check {
				return replayCheck(cmd, js, services, bar)
			}
			return replayPrint(cmd, js, seq, at, asJSON, bar)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the status contract)")
	cmd.Flags().Uint64Var(&seq, "seq", 0, "replay up to this stream sequence (default: the end)")
	cmd.Flags().StringVar(&at, "at", "", "replay up to this time (RFC 3339)")
	cmd.Flags().BoolVar(&check, "check", false, "compare each --service's live projection with a replay")
	cmd.Flags().StringSliceVar(&services, "service", []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081"},
		"base URL of a dispatcher or watchdog (repeatable)")
	return cmd
}

// replayCheck compares each service's live projection with a replay up to
// the same sequence, printing every difference; it fails when any service
// differs, so that a script can tell a diverged service from a healthy one.
func replayCheck(cmd *cobra.Command, js jetstream.JetStream, services []string, bar *cli.ProgressBar) error {
	out := cmd.OutOrStdout()
	bad := 0
	for _, url := range services {
		diffs, seq, err := cli.Check(cmd.Context(), js, url, bar.Update)
		bar.Done()
		if err != nil {
			return err
		}
		if len(diffs) == 0 {
			fmt.Fprintf(out, "%s: live projection equals a replay at seq %d\n", url, seq)
			continue
		}
		bad++
		fmt.Fprintf(out, "%s: %d differences from a replay at seq %d (restart the service to rebuild its state):\n", url, len(diffs), seq)
		for _, d := range diffs {
			fmt.Fprintln(out, "  "+d)
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d services differ from the log", bad, len(services))
	}
	return nil
}

// replayPrint folds the log up to --seq or --at and prints the fleet as
// `berth status` does, with the invariants that history breaks. Notes about
// where the replay started or ended go to stderr, so that --json output
// stays the status contract alone.
func replayPrint(cmd *cobra.Command, js jetstream.JetStream, seq uint64, at string, asJSON bool, bar *cli.ProgressBar) error {
	if seq != 0 && at != "" {
		return usageError{fmt.Errorf("--seq and --at both name a point in the log: give one")}
	}
	var until time.Time
	if at != "" {
		var err error
		if until, err = time.Parse(time.RFC3339, at); err != nil {
			return usageError{fmt.Errorf("--at %q: give an RFC 3339 time such as 2026-11-30T09:00:00Z", at)}
		}
	}
	r, err := cli.Replay(cmd.Context(), js, seq, until, bar.Update)
	bar.Done()
	if err != nil {
		return readError(err)
	}
	st, violations := r.Status, r.Violations
	if note := r.Note(); note != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), note)
	}
	if seq > st.AsOfSeq {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: the log ends at seq %d; this is the fleet as of then\n", st.AsOfSeq)
	}
	if err := cli.PrintStatus(cmd.OutOrStdout(), st, asJSON, time.Now()); err != nil {
		return err
	}
	if len(violations) > 0 && !asJSON {
		fmt.Fprintln(cmd.OutOrStdout(), "invariants broken in this history:")
		for _, v := range violations {
			fmt.Fprintln(cmd.OutOrStdout(), "  "+v.String())
		}
	}
	return nil
}

// undo names the words a user may try for the way back: uncordon also
// ends an operator's drain.
var undo = map[string][]string{"uncordon": {"undrain"}}

// reasonExample is the example's --reason: a reason for taking a host out,
// one for bringing it back.
var reasonExample = map[string]string{
	"cordon":   ` --reason "disk replacement"`,
	"drain":    ` --reason "disk replacement"`,
	"uncordon": ` --reason "disk replaced"`,
}

func hostActionCmd(natsURL *string, action, short string) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:     action + " HOST",
		Aliases: undo[action],
		Short:   short,
		Args:    exactArgs(1),
		Example: "  berth " + action + " mac-mini-01" + reasonExample[action],
		RunE: func(cmd *cobra.Command, args []string) error {
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			seq, err := cli.HostAction(cmd.Context(), js, action, args[0], reason)
			var same cli.Unchanged
			if errors.As(err, &same) {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %v; `berth hosts` shows it\n", action, args[0], err)
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s: stored at seq %d; `berth hosts` shows it\n", action, args[0], seq)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (shown in status and the log)")
	cmd.ValidArgsFunction = firstArg(completeNames(natsURL, nameHost))
	return cmd
}

func hostsCmd(natsURL *string) *cobra.Command {
	return &cobra.Command{
		Use:   "hosts",
		Short: "List hosts: state, cordons and their reasons, live VMs against the physical cap, heartbeats",
		RunE: func(cmd *cobra.Command, args []string) error {
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			st, err := cli.FleetStatus(cmd.Context(), js)
			if err != nil {
				return readError(err)
			}
			return cli.PrintHosts(cmd.OutOrStdout(), st, time.Now())
		},
	}
}

func jobsCmd(natsURL *string) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:     "jobs",
		Short:   "List jobs, newest first (one job's whole history: berth events --job ID)",
		Example: "  berth jobs --limit 20",
		RunE: func(cmd *cobra.Command, args []string) error {
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			f, _, err := eventlog.ReplayFrom(cmd.Context(), js, 0, time.Time{}, nil)
			if err != nil {
				return readError(err)
			}
			return cli.PrintJobs(cmd.OutOrStdout(), f, limit)
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "how many (0: all)")
	return cmd
}

func releaseCmd(natsURL *string) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "release ATTEMPT",
		Short: "Give an attempt's slot back by hand and tear its VM down (what a slot-leak alarm asks for)",
		Long: "release appends the facts a stuck reaction failed to: the slot's release on its pool's\n" +
			"ledger (with the ledger's concurrency check) and the VM's teardown request. Use it after\n" +
			"`berth replay --check` shows the log agrees that the slot is held by nothing live.",
		Args:    exactArgs(1),
		Example: "  berth release berth-4242-1",
		RunE: func(cmd *cobra.Command, args []string) error {
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			what, err := cli.ReleaseAttempt(cmd.Context(), js, args[0], force)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", args[0], what)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "release even if its runner is running a job (that job will fail)")
	cmd.ValidArgsFunction = firstArg(completeNames(natsURL, nameAttempt))
	return cmd
}

func natsAuthCmd() *cobra.Command {
	var hosts, instances []string
	var out string
	cmd := &cobra.Command{
		Use:   "nats-auth",
		Short: "Write NATS authorization for Berth: one nkey per service, each allowed only its own facts",
		Long: "nats-auth writes auth.conf (the BERTH account with JetStream, one user per service with the\n" +
			"subjects its role may publish, and a system-account user) and one seed file per user (0600):\n" +
			"dispatcher.nk, watchdog.nk, cli.nk, admin.nk, agent-HOST.nk for each host, sys.nk. Agents may\n" +
			"publish only their own host's facts; the dispatcher no host facts; the watchdog no job facts;\n" +
			"only admin (keep it with the operators) creates and updates the stream: berth stream apply.\n" +
			"Each service reads the log only through its own consumer, granted by exact name: a dispatcher\n" +
			"or watchdog replica's is berth-<service>-<instance>, so every replica runs with an instance name\n" +
			"given to --instances (config instance, or BERTH_INSTANCE).\n" +
			"Running it again makes new keys (rotation): restart NATS and the services after.",
		Example: `  berth nats-auth --hosts mac-mini-01,linux-01 --out /etc/nats/berth
  # auth.conf beside nats-server.conf (nats-server reads include paths relative to its
  # config file), and in nats-server.conf: include auth.conf
  # each service's config: nats: {nkey_file: /etc/berth/dispatcher.nk}, instance: "1" (or 2, 3)
  nats --nkey /etc/nats/berth/sys.nk server report jetstream`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(hosts) == 0 {
				return usageError{errors.New("--hosts is required: the agents' host names, comma-separated")}
			}
			a, err := natsauth.Generate(hosts, instances)
			if err != nil {
				return usageError{err}
			}
			files, err := a.Write(out)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, f := range files {
				fmt.Fprintln(w, "wrote", f)
			}
			fmt.Fprintf(w, "next: put %s beside nats-server.conf and add `include auth.conf` to it (nats-server\n"+
				"reads include paths relative to its config file), restart it; run\n"+
				"berth --nats-nkey %s stream apply --config berth.yaml, then\n"+
				"for each dispatcher instance I: berth --nats-nkey %s trust add $(berth dispatcher key --instance I --config berth.yaml);\n"+
				"give each service its seed as nats.nkey_file (agents: agent-HOST.nk) and each dispatcher and\n"+
				"watchdog replica one of the instance names %s (config instance or BERTH_INSTANCE);\n"+
				"tools: berth --nats-nkey %s status\n",
				filepath.Join(out, "auth.conf"), filepath.Join(out, "admin.nk"), filepath.Join(out, "admin.nk"),
				strings.Join(instancesOr(instances), ", "), filepath.Join(out, "cli.nk"))
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&hosts, "hosts", nil, "the agents' host names, comma-separated")
	cmd.Flags().StringSliceVar(&instances, "instances", nil,
		"the dispatcher and watchdog replicas' instance names, comma-separated (default "+strings.Join(natsauth.DefaultInstances, ",")+")")
	cmd.Flags().StringVar(&out, "out", "nats-auth", "directory to write auth.conf and the seed files into")
	return cmd
}

// instancesOr is the instances given, or natsauth's default.
func instancesOr(in []string) []string {
	if len(in) == 0 {
		return natsauth.DefaultInstances
	}
	return in
}

func streamCmd(natsURL *string) *cobra.Command {
	cmd := &cobra.Command{Use: "stream", Short: "Administer the event log's stream and KV buckets (admin credential)"}
	var cfgPath string
	var grantAgents bool
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Create or update the stream and the KV buckets to the config's nats section",
		Long: "apply creates BERTH_EVENTS and the KV buckets (snapshots, heartbeats, parked, trust), or updates\n" +
			"them to the config's nats section (max_age, max_bytes, max_msgs, replicas, duplicate_window), and\n" +
			"prints what changed. It is idempotent. Only the admin credential (admin.nk from berth nats-auth)\n" +
			"may do it: services only check that the stream is there and report drift on /healthz.",
		Example: `  berth --nats-nkey /etc/nats/berth/admin.nk stream apply --config /etc/berth/berth.yaml`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			url := c.NATS.URL
			if url == "" || cmd.Flags().Changed("nats") {
				url = *natsURL
			}
			closeNC, js, err := run.JetStreamAs(url, natsauth.RoleAdmin)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			lines, err := run.ApplyStream(ctx, js, c)
			if err == nil && grantAgents {
				var granted []string
				granted, err = run.GrantAgents(ctx, js, c.Agents, "berth stream apply")
				lines = append(lines, granted...)
			}
			for _, l := range lines {
				fmt.Fprintln(cmd.OutOrStdout(), l)
			}
			if err != nil {
				return natsError{fmt.Errorf("%w (is this the admin credential? berth --nats-nkey admin.nk stream apply)", err)}
			}
			return nil
		},
	}
	apply.Flags().StringVar(&cfgPath, "config", "/etc/berth/berth.yaml", "config file (its nats section)")
	apply.Flags().BoolVar(&grantAgents, "grant-agents", false, "also grant every host in the config's agents what it announces (berth trust host HOST --config FILE for each)")
	cmd.AddCommand(apply)
	return cmd
}

// natsGiven reports whether the NATS URL was given on the command line
// (--nats) or in BERTH_NATS_URL: then it wins over the config's nats.url,
// as it does for every other command.
func natsGiven(cmd *cobra.Command) bool {
	if f := cmd.Flag("nats"); f != nil && f.Changed {
		return true
	}
	return os.Getenv("BERTH_NATS_URL") != ""
}

// rawParse is strconv's wording inside pflag's error for a flag value
// that is not a number.
var rawParse = regexp.MustCompile(`: strconv\.Parse\w+: parsing "[^"]*": (invalid syntax|value out of range)`)

// flagError is a usage error (exit 2) in words: a value that is not a
// number says so, not strconv's message.
func flagError(c *cobra.Command, err error) error {
	msg := err.Error()
	switch {
	case rawParse.MatchString(msg):
		return usageError{errors.New(rawParse.ReplaceAllString(msg, ": give a whole number"))}
	case strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "unknown shorthand flag"):
		// Name the command whose flags to list, not "COMMAND".
		return usageError{fmt.Errorf("%w\nrun `%s --help` to list its flags", err, c.CommandPath())}
	}
	return usageError{err}
}
