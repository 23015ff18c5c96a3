package watchdog

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
)

// Defaults of the degradation rule (law 11): this many placement failures
// in a row charged to a host, its image or its backend, within the window,
// mark the host degraded.
const (
	DefaultDegradeAfter  = 3
	DefaultDegradeWindow = 15 * time.Minute
)

// hostHealth marks a host degraded after DegradeAfter failures in a row
// charged to it (its machine, image or backend) within DegradeWindow, and
// lifts the mark once a probe placement proves it (a create that returned;
// for an image, a runner that ran a job). Each degradation raises one alarm
// per pool the host offers, cleared with it.
func (p *Plan) hostHealth(f *events.Fleet, h *events.Host, now time.Time, par Params) {
	after, window := par.DegradeAfter, par.DegradeWindow
	if after <= 0 {
		after = DefaultDegradeAfter
	}
	if window <= 0 {
		window = DefaultDegradeWindow
	}
	hh := &h.Health
	degraded, culprit, reason := hh.Degraded && !hh.Proven(), hh.Culprit, hh.Reason
	switch {
	case hh.Degraded && hh.Proven():
		p.Recover = append(p.Recover, events.HostRecovered{HostChange: events.HostChange{Host: h.Name, At: now, By: By,
			Reason: "a probe placement succeeded after the host was degraded for " + hh.Culprit + " failures"}})
	case !hh.Degraded:
		n, c, _ := hh.Streak(now.Add(-window))
		if n < after {
			break
		}
		last := hh.Failures[len(hh.Failures)-1]
		degraded, culprit = true, c
		reason = fmt.Sprintf("%d placements in a row failed, charged to the %s (last: %s, %s); the jobs keep their attempts; "+
			"placements go to healthy hosts and one probe at a time comes back here after a back-off; %s",
			n, c, last.Attempt, last.Reason, advice(c))
		p.Degrade = append(p.Degrade, events.HostDegraded{HostChange: events.HostChange{Host: h.Name, At: now, By: By,
			Reason: reason}, Culprit: c, Failures: n})
	}
	p.degradedAlarms(f, h, now, degraded, func() string { return fmt.Sprintf("host %s is degraded (%s): %s", h.Name, culprit, reason) })
}

// advice says what an operator checks for a culprit.
func advice(culprit string) string {
	switch culprit {
	case events.CulpritImage:
		return "the runners start and never take a job: check the image's runner version (GitHub refuses runners older than 30 days) and its network"
	case events.CulpritBackend:
		return "the backend reported the fault as its own: check its service (capacity, API answers)"
	case events.CulpritBerth:
		return "the agent could not open the placements (its log names the sealing key): trust each dispatcher instance's key with berth trust add $(berth dispatcher key --instance I), and check the host's curve key"
	}
	return "check the host's backend create step and the agent's log"
}

// degradedAlarms raises, for a degraded host, one alarm per pool it offers,
// and clears them when the host is healthy again; msg is the alarm's
// message, made only when one is raised.
func (p *Plan) degradedAlarms(f *events.Fleet, h *events.Host, now time.Time, degraded bool, msg func() string) {
	p.poolAlarms(f, h, events.AlarmHostDegraded, now, func(string) bool { return degraded }, func(string) string { return msg() })
}

// poolAlarms raises, for each pool h offers, the alarm kind/pool/host while
// on says it holds (with msg's message), and clears it once it does not.
// It runs for every host on every round, so it allocates nothing while
// nothing changes: the message is made only for an alarm it raises, and a
// host's few pools are sorted in place on the stack (500 hosts' messages,
// made and dropped, were 2,500 allocations a round).
func (p *Plan) poolAlarms(f *events.Fleet, h *events.Host, kind string, now time.Time, on func(pool string) bool, msg func(pool string) string) {
	var buf [8]string
	pools := buf[:0]
	for pool := range h.Pools {
		pools = append(pools, pool)
	}
	slices.Sort(pools)
	var kb [128]byte
	for _, pool := range pools {
		key := alarmKey(kb[:0], kind, pool, h.Name)
		al := f.Alarms[string(key)] // a lookup by converted bytes makes no string
		switch holds, active := on(pool), al != nil && al.Active; {
		case holds && !active:
			p.Raise = append(p.Raise, events.AlarmRaised{Key: string(key), Kind: kind, Pool: pool, At: now, Message: msg(pool)})
		case !holds && active:
			p.Clear = append(p.Clear, events.AlarmCleared{Key: string(key), Pool: pool, At: now})
		}
	}
}

// alarmKey appends the key of alarm kind on pool for host to b:
// kind/pool/host.
func alarmKey(b []byte, kind, pool, host string) []byte {
	b = append(append(append(b, kind...), '/'), pool...)
	return append(append(b, '/'), host...)
}

// overclaimAlarm raises one fleet alarm per host whose announcement claims
// more than its grant (events.Offer; culprit: the host), saying how and
// the admin's command, and clears it once the claim fits its grant again.
func (p *Plan) overclaimAlarm(f *events.Fleet, h *events.Host, now time.Time) {
	var kb [128]byte
	key := alarmKey(kb[:0], events.AlarmHostOverclaim, "fleet", h.Name)
	al := f.Alarms[string(key)] // a lookup by converted bytes makes no string
	active := al != nil && al.Active
	switch over := len(h.Overclaim) > 0; {
	case over && !active:
		p.Raise = append(p.Raise, events.AlarmRaised{Key: string(key), Kind: events.AlarmHostOverclaim, Pool: "fleet", At: now,
			Message: fmt.Sprintf("host %s announces more than the admin granted it (%s): it is offered only what its grant allows; "+
				"if the host is yours and its config right, grant it: %s (or --pool NAME=SLOTS:LABELS); "+
				"if not, its credential may be misused: cordon it and rotate its key (docs/security.md)",
				h.Name, strings.Join(h.Overclaim, "; "), events.OverclaimCommand(h.Name))})
	case !over && active:
		p.Clear = append(p.Clear, events.AlarmCleared{Key: string(key), Pool: "fleet", At: now})
	}
}

// gitHubAlarm raises a fleet alarm while GitHub's last word was a refusal
// of the App's own credentials, and clears it once a placement came after.
func (p *Plan) gitHubAlarm(f *events.Fleet, now time.Time) {
	key := events.AlarmGitHubRefused + "/fleet"
	al := f.Alarms[key]
	active := al != nil && al.Active
	switch refusing := f.GitHub.Refusing(); {
	case refusing && !active:
		p.Raise = append(p.Raise, events.AlarmRaised{Key: key, Kind: events.AlarmGitHubRefused, Pool: "fleet", At: now,
			Message: "GitHub refused the App's own credentials (401, or 403 not for rate) since " +
				f.GitHub.Refused.At.Format(time.RFC3339) + ": JIT-config calls pause with a back-off and every job waits as demand " +
				"(none loses an attempt); check the App's private key, its installation and its permissions; the alarm clears at the next placement"})
	case !refusing && active:
		p.Clear = append(p.Clear, events.AlarmCleared{Key: key, Pool: "fleet", At: now})
	}
}

// culprit is who a release the watchdog decides is charged to (law 11): a
// runner that started and never took a job, its image; a booking that got
// its JIT config and no runner in time, its host; one that never got a JIT
// config, GitHub (its answer never came in time); a lost host or a job
// past its maximum duration, no placement failure (""). But a deadline
// that ran across a fault of NATS the watchdog itself saw (natsFault,
// since the booking) is charged to NATS: the facts that would have met it
// may not have reached the log (an agent could not append its runner's
// start, nor read the trust bucket to open the placement), and a host must
// not be degraded for the log's outage.
func culprit(a *events.Attempt, reason string, natsFault time.Time) string {
	timeout := reason == events.ReleaseProvisionTimeout || reason == events.ReleaseRegistration
	switch {
	case timeout && !natsFault.IsZero() && !natsFault.Before(a.ReservedAt):
		return events.CulpritNATS
	case reason == events.ReleaseRegistration:
		return events.CulpritImage
	case reason == events.ReleaseProvisionTimeout && !a.Placed && !a.Warm:
		return events.CulpritGitHub
	case reason == events.ReleaseProvisionTimeout:
		return events.CulpritHost
	}
	return ""
}

// imageAlarms raises, for each pool of h whose image GitHub refuses the
// runners of (events.ImageHealth), one alarm naming the image, the refused
// version and the minimum, and clears it once the image works again.
func (p *Plan) imageAlarms(f *events.Fleet, h *events.Host, now time.Time) {
	p.poolAlarms(f, h, events.AlarmImageDegraded, now, func(pool string) bool { return h.ImageDegraded(pool) != nil },
		func(pool string) string { return imageMessage(h.Name, pool, h.ImageDegraded(pool)) })
}

// imageMessage says which image GitHub refuses, why, the least version it
// takes, and what to do.
func imageMessage(host, pool string, img *events.ImageHealth) string {
	minimum := "GitHub names no minimum in this refusal: use a release of actions/runner published within the last 30 days " +
		"(since 2026-09-25 GitHub refuses older ones)"
	if img.Minimum != "" {
		minimum = "GitHub requires at least " + img.Minimum + " and a release published within the last 30 days"
	}
	version := img.RefusedVersion
	if version == "" {
		version = "(version not printed)"
	}
	return fmt.Sprintf("image %s on host %s (pool %s) is degraded: GitHub refused its runner %s (%q); %s. "+
		"Jobs of the pool lose no attempt and wait as demand (other hosts serve them if they can); "+
		"rebuild the image with a current actions/runner, or let the runner update itself; "+
		"one probe placement at a time comes back here after a back-off, and the alarm clears when a runner of the image takes a job or reports another version",
		img.Name, host, pool, version, img.Message, minimum)
}
