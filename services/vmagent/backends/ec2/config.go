package ec2

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Kind is the name of the ec2 backend's section: `backend: {ec2: ...}`.
const Kind = "ec2"

// Settings is an agent's `backend: {ec2: ...}` section. It launches one
// instance per attempt through the EC2 API. One agent drives one fleet:
// every instance it launches is tagged berth:fleet=Fleet, and its inventory
// and orphan sweep see only that fleet's instances.
type Settings struct {
	// Region is the AWS region, e.g. us-east-1 (required).
	Region string `yaml:"region"`
	// Endpoint overrides the EC2 endpoint URL (a VPC endpoint, or a fake
	// in tests); empty means the region's public endpoint.
	Endpoint string `yaml:"endpoint"`
	// Profile names a shared-config profile (~/.aws/config); empty means
	// the default credential chain (environment, instance role, ...).
	Profile string `yaml:"profile"`
	// LaunchTemplate (id or name, and version) and/or AMI say what to boot;
	// at least one is required. With both, AMI overrides the template's
	// image.
	LaunchTemplate LaunchTemplate `yaml:"launch_template"`
	AMI            string         `yaml:"ami"`
	// InstanceTypes in order of preference; required without a launch
	// template. Subnets (in different zones) are tried in order for each
	// type; empty means the template's or the default VPC's.
	InstanceTypes []string `yaml:"instance_types"`
	Subnets       []string `yaml:"subnets"`
	// SecurityGroups are security group ids (sg-...), for launches without
	// a template that sets them.
	SecurityGroups []string `yaml:"security_groups"`
	// Spot: "" (on-demand only), "prefer" (spot, then on-demand when no spot
	// capacity is found) or "only". SpotMaxPrice, optional, is USD per hour.
	Spot         string `yaml:"spot"`
	SpotMaxPrice string `yaml:"spot_max_price"`
	// Fleet is the berth:fleet tag value (default: the agent's host).
	Fleet string `yaml:"fleet"`
	// Tags are extra tags on every instance and volume (keys may not start
	// with aws: or berth:).
	Tags map[string]string `yaml:"tags"`
	// UserData is a text/template for the instance's user data, or
	// UserDataFile the path of one; empty means the backend's default
	// (a shell script that starts /home/runner/actions-runner/run.sh with
	// the JIT config). See userdata.go for the fields it gets.
	UserData     string `yaml:"user_data"`
	UserDataFile string `yaml:"user_data_file"`
	// MaxAttempts per API call (SDK retries for throttling and 5xx, default
	// 5) and MaxBackoff between them (default 20s).
	MaxAttempts int           `yaml:"max_attempts"`
	MaxBackoff  time.Duration `yaml:"max_backoff"`
	// AssignByRestart lets this host keep warm VMs (dispatcher.warm_pools):
	// a warm instance boots once without a JIT config and powers off
	// (stopped); a job's JIT config is written into its user data and the
	// instance started again (warm.go). The image must run user data at
	// every boot. StatePollEvery paces the wait for it to stop (default 5s).
	AssignByRestart bool          `yaml:"assign_by_restart"`
	StatePollEvery  time.Duration `yaml:"state_poll_every"`
	// Steps bound create and stop (law 3).
	backend.Steps `yaml:",inline"`
}

// LaunchTemplate names a launch template by ID or Name, and its Version:
// a number, $Latest or $Default (the default).
type LaunchTemplate struct {
	ID      string `yaml:"id"`
	Name    string `yaml:"name"`
	Version string `yaml:"version"`
}

func init() {
	backend.Register(backend.Kind{Name: Kind,
		NewSettings: func() backend.Settings { return &Settings{} },
		New: func(ctx context.Context, s backend.Settings, h backend.Host) (backend.Backend, error) {
			e, ok := s.(*Settings)
			if !ok {
				return nil, fmt.Errorf("ec2 backend: settings of type %T", s)
			}
			logger := h.Logger
			if logger != nil {
				logger = logger.With("backend", Kind)
			}
			return FromSettings(ctx, *e, logger)
		}})
}

// Defaults implements backend.Settings: the fleet is the host's, the
// template's default version, and the SDK's retry budget.
func (e *Settings) Defaults(h backend.Host) {
	def(&e.Fleet, h.Name)
	def(&e.LaunchTemplate.Version, "$Default")
	def(&e.MaxAttempts, 5)
	def(&e.MaxBackoff, 20*time.Second)
	def(&e.StatePollEvery, 5*time.Second)
}

func def[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// FromSettings builds the backend an agent's `backend: {ec2: ...}` section
// describes (already defaulted and validated). A user_data_file is read
// here, relative to the working directory.
func FromSettings(ctx context.Context, c Settings, logger *slog.Logger) (*Backend, error) {
	userData := c.UserData
	if c.UserDataFile != "" {
		b, err := os.ReadFile(c.UserDataFile)
		if err != nil {
			return nil, fmt.Errorf("ec2 backend: user_data_file: %w", err)
		}
		userData = string(b)
	}
	o := Options{
		Region: c.Region, Endpoint: c.Endpoint, Profile: c.Profile,
		LaunchTemplateID: c.LaunchTemplate.ID, LaunchTemplateName: c.LaunchTemplate.Name, LaunchTemplateVersion: c.LaunchTemplate.Version,
		AMI: c.AMI, InstanceTypes: c.InstanceTypes, Subnets: c.Subnets, SecurityGroups: c.SecurityGroups,
		Spot: Spot(c.Spot), SpotMaxPrice: c.SpotMaxPrice, Fleet: c.Fleet, Tags: c.Tags, UserData: userData,
		MaxAttempts: c.MaxAttempts, MaxBackoff: c.MaxBackoff, Logger: logger,
		AssignByRestart: c.AssignByRestart, PollEvery: c.StatePollEvery,
	}
	return New(ctx, o)
}
