package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/berth-ci/berth/services/trust"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"
)

// trustCmd is the admin's way to say which dispatcher keys agents accept
// sealed placements from (berth_trust; docs/security.md).
func trustCmd(natsURL *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trust",
		Short: "Trust a dispatcher's sealing key (admin credentials): agents open only placements it sealed",
	}
	var name string
	add := &cobra.Command{
		Use:   "add KEY",
		Short: "Trust the dispatcher sealing key KEY (an X… curve public key the dispatcher logs at start)",
		Long: "add writes KEY into the KV bucket berth_trust, which only the admin may write. Agents\n" +
			"see it within seconds and open JIT configs sealed by it. To distrust a key:\n" +
			"nats kv del berth_trust dispatcher.KEY",
		Args:    exactArgs(1),
		Example: "  berth --nats-nkey admin.nk trust add $(berth dispatcher key --config berth.yaml) --name dispatcher-eu-1",
		RunE: func(cmd *cobra.Command, args []string) error {
			if !nkeys.IsValidPublicCurveKey(args[0]) {
				return usageError{fmt.Errorf("%q is not a curve public key (X…): copy the key the dispatcher logs as \"sealing key\"", args[0])}
			}
			closeNC, js, err := run.JetStream(*natsURL)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			if err := trust.AddDispatcher(ctx, js, args[0], name); err != nil {
				return fmt.Errorf("trust %s: %w (only the admin may write berth_trust: berth --nats-nkey admin.nk trust add KEY)", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "trusted %s (%s): agents open placements it seals\n", args[0], name)
			return nil
		},
	}
	add.Flags().StringVar(&name, "name", "dispatcher", "whose key it is, kept beside it")
	cmd.AddCommand(add, trustHostCmd(natsURL))
	return cmd
}

// trustHostCmd is the admin's grant of what a host may offer (HostGranted):
// every fold offers a host only what both its announcement and its grant
// say, and a host with no grant nothing (docs/security.md).
func trustHostCmd(natsURL *string) *cobra.Command {
	var cfgPath, by string
	var pools []string
	var physical int
	var revoke bool
	cmd := &cobra.Command{
		Use:   "host HOST (--config FILE | --pool NAME=SLOTS:LABEL,LABEL ... | --revoke)",
		Short: "Grant a host the pools it may offer (admin credential); a host is offered nothing until granted",
		Long: "host writes the admin's grant for HOST: the pools, labels, slots and physical cap it may offer.\n" +
			"Every dispatcher, watchdog and status offers a host only what both its announcement and its newest\n" +
			"grant say; a pool announced with other labels than granted, or not granted, is offered nothing and\n" +
			"raises a host_overclaim alarm. --config grants what the config's agent HOST announces; --pool grants\n" +
			"pools by hand; --revoke takes every pool away.",
		Example: "  berth --nats-nkey admin.nk trust host linux-01 --config /etc/berth/berth.yaml\n" +
			"  berth --nats-nkey admin.nk trust host linux-01 --pool linux=4:self-hosted,linux --cap 4\n" +
			"  berth --nats-nkey admin.nk trust host linux-01 --revoke",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := hostGrant(args[0], cfgPath, pools, physical, revoke, by)
			if err != nil {
				return usageError{err}
			}
			closeNC, js, err := run.JetStreamAs(*natsURL, natsauth.RoleAdmin)
			if err != nil {
				return natsError{err}
			}
			defer closeNC()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			if err := run.Grant(ctx, js, g); err != nil {
				return natsError{err}
			}
			fmt.Fprintln(cmd.OutOrStdout(), run.GrantLine(g))
			return nil
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "grant what this config's agent HOST announces")
	cmd.Flags().StringArrayVar(&pools, "pool", nil, "grant a pool: NAME=SLOTS:LABEL,LABEL[@INSTALLATION] (repeat for each pool; @INSTALLATION: a dispatcher.github entry after the first)")
	cmd.Flags().IntVar(&physical, "cap", 0, "with --pool: the host's physical cap (default: the sum of the slots)")
	cmd.Flags().BoolVar(&revoke, "revoke", false, "take every pool away: the host is offered nothing")
	cmd.Flags().StringVar(&by, "by", "admin", "who grants, kept in the fact")
	return cmd
}

// hostGrant builds the grant trust host writes from exactly one of its
// three ways.
func hostGrant(host, cfgPath string, pools []string, physical int, revoke bool, by string) (events.HostGranted, error) {
	now := time.Now().UTC()
	if err := events.ValidName("host", host); err != nil {
		return events.HostGranted{}, err
	}
	ways := 0
	for _, set := range []bool{cfgPath != "", len(pools) > 0, revoke} {
		if set {
			ways++
		}
	}
	if ways != 1 {
		return events.HostGranted{}, fmt.Errorf("give exactly one of --config FILE, --pool NAME=SLOTS:LABELS or --revoke")
	}
	switch {
	case revoke:
		return events.HostGranted{Host: host, Pools: map[string]events.PoolGrant{}, By: by, At: now}, nil
	case cfgPath != "":
		c, err := loadConfig(cfgPath)
		if err != nil {
			return events.HostGranted{}, err
		}
		for _, a := range c.Agents {
			if a.Host == host {
				return run.AgentGrant(a, by, now), nil
			}
		}
		return events.HostGranted{}, fmt.Errorf("no agent for host %q in %s: grant with --pool, or add it to agents", host, cfgPath)
	}
	g := events.HostGranted{Host: host, Pools: map[string]events.PoolGrant{}, PhysicalCap: physical, By: by, At: now}
	for _, spec := range pools {
		name, rest, ok1 := strings.Cut(spec, "=")
		slots, labels, ok2 := strings.Cut(rest, ":")
		labels, inst, named := strings.Cut(labels, "@")
		n, err := strconv.Atoi(slots)
		if !ok1 || !ok2 || err != nil || n < 1 || labels == "" || events.ValidName("pool", name) != nil ||
			(named && events.ValidName("installation", inst) != nil) {
			return events.HostGranted{}, fmt.Errorf("--pool %q: give NAME=SLOTS:LABEL,LABEL[@INSTALLATION], e.g. linux=4:self-hosted,linux", spec)
		}
		g.Pools[name] = events.PoolGrant{Labels: events.NormalizeLabels(strings.Split(labels, ",")), Slots: n, Installation: inst}
	}
	return g, nil
}

// dispatcherKeyCmd prints the dispatcher's sealing key, making it first if
// need be, so the admin can trust it before the dispatcher ever starts:
// berth trust add $(berth dispatcher key --config berth.yaml).
func dispatcherKeyCmd() *cobra.Command {
	var cfgPath, inst string
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Print a dispatcher instance's sealing key (made now if it has none), for `berth trust add`",
		Long: "key prints the sealing key of the dispatcher instance named by --instance (else the config's\n" +
			"instance, else BERTH_INSTANCE, else the host name): each instance seals with its own key, kept\n" +
			"under <data_dir>/dispatcher/<instance>/, so trust each instance's.",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			if inst != "" {
				c.Instance = inst
				if err := c.Validate(); err != nil {
					return usageError{err}
				}
			}
			file := run.DispatcherKeyFile(c)
			fmt.Fprintln(cmd.ErrOrStderr(), "sealing key of dispatcher instance", filepath.Base(filepath.Dir(file)), "("+file+")")
			kp, err := sealing.LoadKey(file)
			if err != nil {
				return err
			}
			pub, _ := kp.PublicKey()
			fmt.Fprintln(cmd.OutOrStdout(), pub)
			return nil
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "/etc/berth/berth.yaml", "config file")
	cmd.Flags().StringVar(&inst, "instance", "", "the dispatcher instance whose key to print (default: the config's instance, BERTH_INSTANCE, the host name)")
	return cmd
}
