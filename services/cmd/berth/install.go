package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/berth-ci/berth/services/install"
	"github.com/spf13/cobra"
)

// installFlags are the flags install and uninstall share.
func installFlags(cmd *cobra.Command, o *install.Options, now *bool) {
	f := cmd.Flags()
	f.StringVar(&o.Root, "root", "/", "write under this directory instead of / (to inspect what would be written)")
	f.StringVar(&o.Platform, "platform", runtime.GOOS, "linux (systemd unit) or darwin (launchd daemon)")
	f.StringVar(&o.ConfigPath, "config", "", "where the agent's config goes (default /etc/berth/agent.yaml; macOS /usr/local/etc/berth/agent.yaml)")
	f.StringVar(&o.CredsPath, "creds", "", "where the NATS credentials go (default nats.creds beside the config)")
	f.BoolVar(now, "now", false, "also run the systemctl or launchctl commands (only with --root /)")
}

func agentInstallCmd() *cobra.Command {
	var o install.Options
	var now bool
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install this host's agent as a service: a systemd unit (Linux) or launchd daemon (macOS), its config and NATS credentials",
		Long: "install writes the service definition, copies the agent config (--config-from) and the NATS\n" +
			"credentials (--creds-from, mode 0600), and prints the commands that start the service (--now runs\n" +
			"them). Running it again with the same flags changes nothing; after a change, it rewrites what\n" +
			"differs. The service manager gives the agent shutdown_timeout + stop_timeout + 1m to drain on stop.",
		Example: `  sudo berth agent install --config-from ./agent.yaml --creds-from ./agent.creds --host linux-01 --now
  sudo berth agent install --platform darwin --config-from ./agent.yaml --creds-from ./agent.creds --host mac-mini-01 --user ci
  berth agent install --root /tmp/preview --config-from ./agent.yaml   # look before you write`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := nowAllowed(now, o.Root); err != nil {
				return err
			}
			o.Chown = o.Root == "/" && os.Geteuid() == 0
			o.Preview = filepath.Clean(o.Root) != "/"
			res, err := install.Install(o)
			if err != nil {
				return usageError{err}
			}
			out := cmd.OutOrStdout()
			// Paths as they are on this machine: under --root in a preview.
			for _, p := range res.Written {
				fmt.Fprintf(out, "wrote %s\n", filepath.Join(o.Root, p))
			}
			for _, p := range res.Unchanged {
				fmt.Fprintf(out, "unchanged %s (already as it would be written)\n", filepath.Join(o.Root, p))
			}
			for _, n := range res.Notes {
				fmt.Fprintf(out, "note: %s\n", n)
			}
			what := "to start the agent"
			if o.Platform == install.Darwin {
				what += " (the bootout fails harmlessly when the agent is not loaded yet)"
			}
			return commands(cmd.Context(), out, res.Commands, now, what)
		},
	}
	installFlags(cmd, &o, &now)
	f := cmd.Flags()
	f.StringVar(&o.ConfigFrom, "config-from", "", "the agent config to install (required)")
	f.StringVar(&o.CredsFrom, "creds-from", "", "the NATS credentials file to install for the agent")
	f.StringVar(&o.Binary, "binary", "/usr/local/bin/berth", "the berth executable the service runs")
	f.StringVar(&o.Host, "host", "", "which agents[].host this host runs (needed when the config lists several)")
	f.StringVar(&o.User, "user", "berth", "the account the agent runs as")
	return cmd
}

func agentUninstallCmd() *cobra.Command {
	var o install.Options
	var now bool
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove what berth agent install wrote (stop the service first, or pass --now)",
		Long: "uninstall removes the service definition, config and credentials that install wrote, and the\n" +
			"directories it made, if empty. The agent's data (its working directory) and logs stay. With --now it\n" +
			"first stops the service, which drains the host: that can take up to the agent's shutdown_timeout.",
		Example: "  sudo berth agent uninstall --now",
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := nowAllowed(now, o.Root); err != nil {
				return err
			}
			stop, err := install.StopCommands(o)
			if err != nil {
				return usageError{err}
			}
			out := cmd.OutOrStdout()
			if now {
				if err := commands(cmd.Context(), out, stop, true, ""); err != nil {
					return err
				}
			} else if o.Platform == install.Darwin {
				fmt.Fprintf(out, "if the agent is loaded, stop it first (this drains the host): %s, or pass --now\n", strings.Join(stop[0], " "))
			}
			res, err := install.Uninstall(o)
			if err != nil {
				return usageError{err}
			}
			// Paths as they are on this machine: under --root in a preview.
			for _, p := range res.Removed {
				fmt.Fprintf(out, "removed %s\n", filepath.Join(o.Root, p))
			}
			if len(res.Removed) == 0 {
				fmt.Fprintf(out, "nothing to remove under %s: berth agent install wrote nothing there, or it was removed already\n", o.Root)
			}
			return commands(cmd.Context(), out, res.Commands, now, "then")
		},
	}
	installFlags(cmd, &o, &now)
	return cmd
}

func nowAllowed(now bool, root string) error {
	if now && root != "/" {
		return usageError{fmt.Errorf("--now runs systemctl or launchctl on this host: it needs --root / (got %s)", root)}
	}
	return nil
}

// commands prints cmds, or runs them when run is set (a launchctl bootout
// of a service not loaded fails harmlessly and is reported).
func commands(ctx context.Context, out io.Writer, cmds [][]string, run bool, what string) error {
	if !run {
		if len(cmds) > 0 {
			fmt.Fprintln(out, what+", run:")
		}
		for _, c := range cmds {
			fmt.Fprintln(out, "  "+strings.Join(c, " "))
		}
		return nil
	}
	for _, c := range cmds {
		fmt.Fprintln(out, "running: "+strings.Join(c, " "))
		// A stop drains the host: give it the longest a drain may take.
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		e := exec.CommandContext(ctx, c[0], c[1:]...)
		e.Stdout, e.Stderr = out, out
		err := e.Run()
		cancel()
		if err != nil {
			if c[0] == "launchctl" && c[1] == "bootout" {
				fmt.Fprintf(out, "(%v: the service was not loaded)\n", err)
				continue
			}
			return fmt.Errorf("%s: %w", strings.Join(c, " "), err)
		}
	}
	return nil
}
