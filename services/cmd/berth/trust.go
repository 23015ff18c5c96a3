package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

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
	cmd.AddCommand(add)
	return cmd
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
