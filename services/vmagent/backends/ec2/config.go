package ec2

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/berth-ci/berth/services/config"
)

// FromConfig builds the backend an agent's `backend: {ec2: ...}` section
// describes (already defaulted and validated by the config package). A
// user_data_file is read here, relative to the working directory.
func FromConfig(ctx context.Context, c config.EC2, logger *slog.Logger) (*Backend, error) {
	userData := c.UserData
	if c.UserDataFile != "" {
		b, err := os.ReadFile(c.UserDataFile)
		if err != nil {
			return nil, fmt.Errorf("ec2 backend: user_data_file: %w", err)
		}
		userData = string(b)
	}
	return New(ctx, Options{
		Region: c.Region, Endpoint: c.Endpoint, Profile: c.Profile,
		LaunchTemplateID: c.LaunchTemplate.ID, LaunchTemplateName: c.LaunchTemplate.Name, LaunchTemplateVersion: c.LaunchTemplate.Version,
		AMI: c.AMI, InstanceTypes: c.InstanceTypes, Subnets: c.Subnets, SecurityGroups: c.SecurityGroups,
		Spot: Spot(c.Spot), SpotMaxPrice: c.SpotMaxPrice, Fleet: c.Fleet, Tags: c.Tags, UserData: userData,
		MaxAttempts: c.MaxAttempts, MaxBackoff: c.MaxBackoff, Logger: logger,
	})
}
