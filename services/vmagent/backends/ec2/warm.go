package ec2

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sdk "github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Warm instances (issue 20), with AssignByRestart:
//
//   - Create for a warm VM launches the instance as usual but with
//     InstanceInitiatedShutdownBehavior=stop and user data rendered without
//     a JIT config; the template's first boot does what the image needs
//     (the default template: nothing) and powers off. Create returns once
//     EC2 reports the instance stopped: booted once, its volume
//     initialised, costing only its storage while it waits.
//   - Assign renders the user data again with the job's JIT config, writes
//     it with ModifyInstanceAttribute (EC2 changes user data only while an
//     instance is stopped) and starts the instance with StartInstances; the
//     boot runs the new user data, which starts the runner.
//
// The image must run user data at every boot, not only the first
// (cloud-init: `cloud_final_modules: [[scripts-user, always]]`); the JIT
// config never leaves the user data (a tag would show it to anyone who can
// describe the instance). This is EC2 Auto Scaling's own warm-pool shape
// (instances kept Stopped), without the Auto Scaling group.

// errWarmLost: the warm instance ended before it was ready.
var errWarmLost = errors.New("the warm instance is gone before it stopped (it terminated, or its first boot failed)")

// warmedUp waits, for a warm VM, until its instance is stopped (ready to be
// assigned); for any other VM it returns at once.
func (b *Backend) warmedUp(ctx context.Context, vm backend.VM) error {
	if !vm.Warm {
		return nil
	}
	for seen := false; ; {
		state, err := b.state(ctx, vm.Attempt)
		switch {
		case err != nil:
			return fmt.Errorf("ec2 create %s: wait for the warm instance to stop: %w", vm.Attempt, blame(err))
		case state == "stopped":
			b.opts.Logger.Info("ec2: warm instance ready (stopped)", "attempt", vm.Attempt)
			return nil
		case state == "" && seen:
			return fmt.Errorf("ec2 create %s: %w: %w", vm.Attempt, errWarmLost, backend.ErrBackend)
		}
		seen = seen || state != "" // right after the launch EC2 may not list it yet
		t := time.NewTimer(b.opts.PollEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("ec2 create %s: the warm instance did not stop in time (is its first boot powering off?): %w", vm.Attempt, ctx.Err())
		case <-t.C:
		}
	}
}

// state is the state of the attempt's live instance (pending, running,
// stopping or stopped), "" when none is listed.
func (b *Backend) state(ctx context.Context, attempt string) (string, error) {
	state := ""
	err := b.describe(ctx, []types.Filter{{Name: aws.String("tag:" + TagAttempt), Values: []string{attempt}}},
		func(inst types.Instance) {
			if inst.State != nil {
				state = string(inst.State.Name)
			}
		})
	return state, err
}

// Assign implements backend.Backend: it writes the JIT config into the warm
// instance's user data and starts it, and returns once EC2 accepted the
// start; the runner starts with the boot, and the watchdog's registration
// deadline covers one that never comes. Without AssignByRestart it answers
// backend.ErrNoAssign.
func (b *Backend) Assign(ctx context.Context, vm backend.VM) error {
	if !b.opts.AssignByRestart {
		return backend.ErrNoAssign
	}
	vm.Warm = true
	userData, err := b.renderUserData(vm)
	if err != nil {
		return fmt.Errorf("ec2 assign %s: %w", vm.Attempt, err)
	}
	b.mu.Lock()
	ids := b.launched[vm.Attempt].ids
	b.mu.Unlock()
	if len(ids) == 0 {
		if ids, err = b.find(ctx, vm.Attempt); err != nil {
			return fmt.Errorf("ec2 assign %s: look up its instance: %w", vm.Attempt, blame(err))
		}
		if len(ids) == 0 {
			return fmt.Errorf("ec2 assign %s: %w: %w", vm.Attempt, errWarmLost, backend.ErrBackend)
		}
	}
	for _, id := range ids {
		if _, err := b.client.ModifyInstanceAttribute(ctx, &sdk.ModifyInstanceAttributeInput{InstanceId: aws.String(id),
			UserData: &types.SecureBlobAttributeValue{Value: userData}}); err != nil {
			return fmt.Errorf("ec2 assign %s: write the JIT config into %s's user data: %w", vm.Attempt, id, blame(err))
		}
	}
	if _, err := b.client.StartInstances(ctx, &sdk.StartInstancesInput{InstanceIds: ids}); err != nil {
		return fmt.Errorf("ec2 assign %s: start %v: %w", vm.Attempt, ids, blame(err))
	}
	b.opts.Logger.Info("ec2: warm instance assigned and started", "attempt", vm.Attempt, "instances", ids)
	return nil
}
