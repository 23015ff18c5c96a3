package ec2

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"unicode/utf8"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

var (
	regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
	// launch template versions: a number, $Latest or $Default.
	ltVersionRE = regexp.MustCompile(`^([1-9][0-9]*|\$Latest|\$Default)$`)
)

// maxCombinations bounds instance types × subnets (× 2 with spot: prefer):
// each combination is one RunInstances call inside one create deadline.
const maxCombinations = 64

// maxExtraTags: EC2 allows 50 tags per resource; the backend sets 4
// (berth:attempt, berth:pool, berth:fleet, Name).
const maxExtraTags = 46

// Validate implements backend.Settings: it reports every problem of one ec2
// section; at names it (agents[0].backend.ec2).
func (e *Settings) Validate(at string, _ backend.Host, bad backend.Report) {
	e.validateWhere(at, bad)
	e.validateWhat(at, bad)
	e.validateMarket(at, bad)
	e.validateTags(at, bad)
	e.validateUserData(at, bad)
	e.validateCalls(at, bad)
}

// validateWhere checks the region and the endpoint the API is reached at.
func (e *Settings) validateWhere(at string, bad backend.Report) {
	if e.Region == "" {
		bad("%s.region: required, e.g. us-east-1", at)
	} else if !regionRE.MatchString(e.Region) {
		bad("%s.region %q: give a region code such as us-east-1 or eu-west-2, not a zone or a name", at, e.Region)
	}
	if e.Endpoint != "" {
		if u, err := url.Parse(e.Endpoint); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad("%s.endpoint %q: give an http(s) URL such as https://ec2.us-east-1.amazonaws.com, or leave it out", at, e.Endpoint)
		}
	}
}

// validateWhat checks what to boot: a launch template and/or an image, and
// the instance types, subnets and security groups to boot it with.
func (e *Settings) validateWhat(at string, bad backend.Report) {
	lt := e.LaunchTemplate
	hasLT := lt.ID != "" || lt.Name != ""
	switch {
	case lt.ID != "" && lt.Name != "":
		bad("%s.launch_template: give id or name, not both", at)
	case lt.ID != "" && !strings.HasPrefix(lt.ID, "lt-"):
		bad("%s.launch_template.id %q: a launch template id starts with lt-", at, lt.ID)
	}
	if lt.Version != "" && !ltVersionRE.MatchString(lt.Version) {
		bad("%s.launch_template.version %q: give a version number, $Latest or $Default", at, lt.Version)
	}
	if !hasLT && e.AMI == "" {
		bad("%s: give launch_template (id or name) or ami: what to boot", at)
	}
	if e.AMI != "" && !strings.HasPrefix(e.AMI, "ami-") {
		bad("%s.ami %q: an image id starts with ami-", at, e.AMI)
	}
	if !hasLT && len(e.InstanceTypes) == 0 {
		bad("%s.instance_types: required without a launch template, e.g. [m7i.large, m6i.large]", at)
	}
	checkList(at+".instance_types", e.InstanceTypes, "", bad)
	checkList(at+".subnets", e.Subnets, "subnet-", bad)
	checkList(at+".security_groups", e.SecurityGroups, "sg-", bad)
}

// validateMarket checks spot settings and that every combination of type,
// subnet and market fits in one create deadline.
func (e *Settings) validateMarket(at string, bad backend.Report) {
	markets := 1
	switch e.Spot {
	case "", "only":
	case "prefer":
		markets = 2
	default:
		bad("%s.spot %q: use prefer (spot, then on-demand), only, or leave it out for on-demand", at, e.Spot)
	}
	if e.SpotMaxPrice != "" {
		if e.Spot == "" {
			bad("%s.spot_max_price is set but spot is not: set spot: prefer or only", at)
		}
		if p, err := strconv.ParseFloat(e.SpotMaxPrice, 64); err != nil || p <= 0 {
			bad("%s.spot_max_price %q: give USD per hour as a positive number, e.g. \"0.10\"", at, e.SpotMaxPrice)
		}
	}
	if n := max(1, len(e.InstanceTypes)) * max(1, len(e.Subnets)) * markets; n > maxCombinations {
		bad("%s: %d combinations of instance type, subnet and market: at most %d fit in one create deadline; list fewer", at, n, maxCombinations)
	}
}

// validateTags checks the fleet name and the extra tags against EC2's
// limits and the tags Berth sets itself.
func (e *Settings) validateTags(at string, bad backend.Report) {
	if e.Fleet != "" {
		if err := events.ValidName("fleet", e.Fleet); err != nil {
			bad("%s.fleet: %w", at, err)
		}
	}
	if len(e.Tags) > maxExtraTags {
		bad("%s.tags: %d tags; EC2 allows 50 per resource and Berth sets 4, so at most %d", at, len(e.Tags), maxExtraTags)
	}
	for k, v := range e.Tags {
		lk := strings.ToLower(k)
		switch {
		case k == "" || utf8.RuneCountInString(k) > 128 || utf8.RuneCountInString(v) > 256:
			bad("%s.tags %q: keys are 1 to 128 characters, values at most 256", at, k)
		case strings.HasPrefix(lk, "aws:") || strings.HasPrefix(lk, "berth:") || k == "Name":
			bad("%s.tags %q: aws:, berth: and Name are reserved (Berth sets berth:attempt, berth:pool, berth:fleet and Name)", at, k)
		}
	}
}

// validateUserData checks that at most one user data source is given and
// that an inline template parses.
func (e *Settings) validateUserData(at string, bad backend.Report) {
	if e.UserData != "" && e.UserDataFile != "" {
		bad("%s: give user_data or user_data_file, not both", at)
	}
	if e.UserData != "" {
		if _, err := template.New("user_data").Parse(e.UserData); err != nil {
			bad("%s.user_data: not a valid Go text/template: %v", at, err)
		}
	}
}

// validateCalls checks the API retry budget and the step deadlines.
func (e *Settings) validateCalls(at string, bad backend.Report) {
	if e.MaxAttempts < 1 || e.MaxAttempts > 20 {
		bad("%s.max_attempts %d: give 1 to 20 attempts per API call", at, e.MaxAttempts)
	}
	if e.StatePollEvery <= 0 {
		bad("%s.state_poll_every %v: give a positive duration such as 5s", at, e.StatePollEvery)
	}
	if e.MaxBackoff <= 0 {
		bad("%s.max_backoff %v: give a positive duration such as 20s", at, e.MaxBackoff)
	}
	e.Steps.Check(at, bad)
}

// checkList reports empty and repeated entries, and entries without prefix.
func checkList(at string, items []string, prefix string, bad backend.Report) {
	seen := map[string]bool{}
	for _, s := range items {
		switch {
		case strings.TrimSpace(s) == "":
			bad("%s: an empty entry", at)
		case !strings.HasPrefix(s, prefix):
			bad("%s %q: an id that starts with %s", at, s, prefix)
		case seen[s]:
			bad("%s %q appears twice", at, s)
		}
		seen[s] = true
	}
}
