// Package runnerlog reads what a GitHub Actions runner (actions/runner)
// printed: its version, and GitHub's refusal of it. The runner says both
// only in prose, so the strings live here, in one place, with their
// sources; every caller branches on Status.
package runnerlog

import (
	"bytes"
	"regexp"
	"strings"
)

// Status is what a runner's output says so far.
type Status struct {
	// Version is the runner's version without a "v" ("2.310.0"), "" until
	// it printed it.
	Version string
	// Refused: GitHub refused the runner for its version; it exits
	// without taking a job. Message is the line that says so (trimmed)
	// and Minimum the least version GitHub named, "" when it named none.
	Refused bool
	Message string
	Minimum string
}

var (
	// actions/runner (src/Runner.Listener/Runner.cs) at every start:
	//   Current runner version: '2.310.0'
	versionLine = regexp.MustCompile(`Current runner version: '([0-9][0-9A-Za-z.+-]*)'`)
	// actions/runner when the broker refuses its session (GitHub issues
	// actions/runner#1991, #3651, #3658, #4392), with "An error occured: "
	// or "An error occurred: " before it and sometimes "Error: Forbidden ":
	//   Runner version v2.310.0 is deprecated and cannot receive messages.
	deprecated = regexp.MustCompile(`Runner version v?([0-9][0-9A-Za-z.+-]*?) is deprecated and cannot receive messages`)
	// GitHub's answer to a registration by a runner below its minimum
	// (2026, the enforcement of 2.329.0):
	//   Your runner version is out of date and can no longer register with GitHub.
	//   GitHub now requires runner version 2.329.0 or later for registration.
	outOfDate = "runner version is out of date"
	requires  = regexp.MustCompile(`requires runner version v?([0-9][0-9A-Za-z.+-]*?) or later`)
)

// Read parses a runner's output (stdout and stderr, as it printed them;
// a tail of it is enough once it holds the lines that matter). The last
// version printed wins: a runner that updated itself prints its new one.
func Read(out []byte) Status {
	var s Status
	for _, line := range bytes.Split(out, []byte("\n")) {
		text := strings.TrimSpace(string(line))
		if m := versionLine.FindStringSubmatch(text); m != nil {
			s.Version = m[1]
		}
		if m := deprecated.FindStringSubmatch(text); m != nil {
			s.Refused, s.Message = true, text
			if s.Version == "" {
				s.Version = m[1]
			}
		}
		if strings.Contains(strings.ToLower(text), outOfDate) {
			s.Refused, s.Message = true, text
		}
		if m := requires.FindStringSubmatch(text); m != nil {
			s.Minimum = m[1]
			if s.Refused {
				s.Message += " " + text
			}
		}
	}
	return s
}
