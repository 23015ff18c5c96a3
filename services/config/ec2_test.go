package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/vmagent/backends/ec2"
)

// Given the commented EC2 agent at the end of deploy/berth.example.yaml,
// when it is uncommented and loaded, then it is valid, kind ec2 is implied
// by its section, and the defaults are filled.
func TestExampleEC2AgentLoads(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "berth.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "  # - host: aws-use1\n")
	if !ok {
		t.Fatal("the example file has no commented ec2 agent")
	}
	var y strings.Builder
	y.WriteString("agents:\n- host: aws-use1\n")
	for _, line := range strings.Split(block, "\n") {
		y.WriteString(strings.TrimPrefix(line, "  # ") + "\n")
	}
	c, err := Parse([]byte(y.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, y.String())
	}
	be := c.Agents[0].Backend
	e := be.Settings.(*ec2.Settings)
	if be.Kind != "ec2" || e.Region != "us-east-1" || e.LaunchTemplate.Name != "berth-runner" || len(e.InstanceTypes) != 3 ||
		len(e.Subnets) != 2 || e.Spot != "prefer" || e.Fleet != "aws-use1" || e.MaxAttempts != 5 || e.CreateTimeout != 5*time.Minute {
		t.Errorf("unexpected: kind %q, %+v", be.Kind, e)
	}
}

// Given ec2 sections with mistakes, every mistake is reported, each saying
// what to change.
func TestEC2ValidationReportsEveryProblem(t *testing.T) {
	_, err := Parse([]byte(`
agents:
  - host: a
    pools: {p: {labels: [x], slots: 1}}
    backend:
      ec2:
        region: us-east-1a
        endpoint: "ftp://x"
        launch_template: {id: berth, name: both, version: latest}
        ami: img-1
        subnets: [subnet-a, subnet-a, vpc-1]
        spot: always
        spot_max_price: cheap
        tags: {"berth:pool": x}
        user_data: "{{.Attempt"
        max_attempts: 50
  - host: b
    pools: {p: {labels: [x], slots: 1}}
    backend: {ec2: {region: eu-west-2}}
  - host: c
    pools: {p: {labels: [x], slots: 1}}
    backend: {kind: exec, exec: {create: [c], stop: [s]}, ec2: {region: eu-west-2}}
  - host: d
    pools: {p: {labels: [x], slots: 1}}
    backend: {kind: ec2, exec: {create: [c]}, ec2: {region: eu-west-2, ami: ami-1, instance_types: [t3.micro]}}
  - host: e
    pools: {p: {labels: [x], slots: 1}}
    backend: {kind: lambda}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"agents[0].backend.ec2.region \"us-east-1a\"", "endpoint", "id or name, not both", "$Latest",
		"starts with ami-", "\"subnet-a\" appears twice", "starts with subnet-", "spot \"always\"", "spot_max_price",
		"reserved", "text/template", "max_attempts 50",
		"agents[1].backend.ec2: give launch_template", "agents[1].backend.ec2.instance_types: required",
		"agents[2].backend: exec and ec2 sections given", "agents[3].backend: exec and ec2 sections given",
		"agents[4].backend.kind: \"lambda\": not a backend",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}
