package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/berth-ci/berth/services/vmagent/backends/vz"
	"github.com/spf13/cobra"
)

// vzGuestCmd is the helper process the vz backend starts for each macOS
// guest (services/vmagent/backends/vz/helpers.go): it holds one VM and
// serves the agent's calls on stdin and stdout. Hidden: only the agent
// runs it.
func vzGuestCmd() *cobra.Command {
	return &cobra.Command{
		Use:    vz.HelperSubcommand,
		Short:  "Hold one macOS guest for the agent (started by the vz backend; not for operators)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			// The guest ends when the agent asks, when the agent's end of
			// stdin closes, or with this process (SIGKILL); a ^C or SIGTERM
			// meant for the agent must not end it before the agent's drain.
			signal.Ignore(os.Interrupt, syscall.SIGTERM)
			return vz.Serve(context.Background(), os.Stdin, os.Stdout, vz.NewPlatformHypervisor)
		},
	}
}

// vzImportTartCmd makes a vz base image from a Tart VM directory
// (docs/macos.md).
func vzImportTartCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "vz-import-tart TART_VM_DIR BASE_IMAGE_DIR",
		Short: "Make a vz base image (disk.img, aux.img, hardware-model) from a Tart VM directory, e.g. ~/.tart/vms/NAME",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := vz.ImportTart(args[0], args[1], nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "base image written to %s: set backend.vz.base_image to it (docs/macos.md)\n", args[1])
			return nil
		},
	}
}
