package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Operator returns who runs the command, for the By field of operator facts.
func Operator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		h, _ := os.Hostname()
		return "operator:" + u.Username + "@" + h
	}
	return "operator"
}

// HostAction appends an operator fact about a host: "cordon" (no new
// placements), "uncordon", or "drain" (no new placements, and idle runners
// and bookings without a VM are taken back). The host must be known.
func HostAction(ctx context.Context, js jetstream.JetStream, action, host, reason string) (uint64, error) {
	f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
	if err != nil {
		return 0, err
	}
	if _, ok := f.Hosts[host]; !ok {
		var known []string
		for name := range f.Hosts {
			known = append(known, name)
		}
		sort.Strings(known)
		return 0, fmt.Errorf("no host %q in the log; known hosts: %v", host, known)
	}
	if why := unchanged(f.Hosts[host], action, reason); why != "" {
		return 0, Unchanged{Host: host, Why: why}
	}
	now := time.Now().UTC()
	c := events.HostChange{Host: host, Reason: reason, By: Operator(), At: now}
	var p events.Payload
	switch action {
	case "cordon":
		p = events.HostCordoned{HostChange: c}
	case "uncordon":
		p = events.HostUncordoned{HostChange: c}
	case "drain":
		p = events.HostDraining{HostChange: c}
	default:
		return 0, fmt.Errorf("unknown host action %q", action)
	}
	app := &eventlog.Appender{JS: js, Source: "berth/cli", Role: events.RoleCLI}
	stored, err := app.AppendConfirmed(ctx, app.New(now, p), nil)
	return stored.Seq, err
}

// Unchanged is HostAction's answer when the host already is what the
// action asks: nothing is stored, and it is not a failure (exit 0).
type Unchanged struct{ Host, Why string }

func (u Unchanged) Error() string { return u.Host + " " + u.Why + "; nothing stored" }

// unchanged says why action would change nothing on h, or "". A cordon
// giving a new reason is a change: it updates the reason status shows.
func unchanged(h *events.Host, action, reason string) string {
	switch {
	case action == "cordon" && h.Cordoned && (reason == "" || reason == h.CordonReason):
		return "is already cordoned" + byWhom(h.CordonReason, h.CordonBy)
	case action == "drain" && h.State == events.HostStateDraining:
		return "is already draining"
	case action == "uncordon" && !h.Cordoned && h.State != events.HostStateDraining:
		return "is neither cordoned nor draining"
	}
	return ""
}

func byWhom(reason, by string) string {
	s := ""
	if reason != "" {
		s += fmt.Sprintf(" (%q)", reason)
	}
	if by != "" {
		s += " by " + by
	}
	return s
}

// PrintHosts lists hosts.
func PrintHosts(w io.Writer, st events.Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSTATE\tCORDONED\tREASON\tLIVE_VMS/CAP\tABANDONED\tLAST_HEARTBEAT")
	for _, h := range st.Hosts {
		hb := "never"
		if h.LastHeartbeat != nil {
			hb = now.Sub(*h.LastHeartbeat).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%d/%d\t%d\t%s\n", h.Name, h.State, h.Cordoned, dash(hostReason(h)),
			h.LiveVMs, h.PhysicalCap, h.AbandonedVMs, hb)
	}
	return tw.Flush()
}

// PrintJobs lists the jobs the projection holds, newest first, at most
// limit of them (0: all), and says so below the table when it left some
// out.
func PrintJobs(w io.Writer, f *events.Fleet, limit int) error {
	jobs := make([]*events.Job, 0, len(f.Jobs))
	for _, j := range f.Jobs {
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].QueuedAt.After(jobs[b].QueuedAt) })
	all := len(jobs)
	if limit > 0 && len(jobs) > limit {
		jobs = jobs[:limit]
	}
	match := f.NewMatcher()
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATUS\tCONCLUSION\tPOOL\tRUNNER\tATTEMPTS\tQUEUED")
	for _, j := range jobs {
		pool := match.MatchJob(j)
		status := j.Status.String()
		if j.Unschedulable && j.Status < events.StatusInProgress {
			status = "unschedulable"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", j.ID, status, dash(j.Conclusion), dash(pool), dash(j.Runner),
			j.Minted, j.QueuedAt.Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(jobs) < all {
		_, err := fmt.Fprintf(w, "(the newest %d of %d jobs; --limit 0 lists them all)\n", len(jobs), all)
		return err
	}
	return nil
}

// ReleaseAttempt is the operator's hand release (`berth release ATTEMPT`):
// it gives the attempt's slot back, if it still holds one, with the pool
// ledger's concurrency check, and asks for its VM's teardown. Both facts are
// idempotent, so running it twice is harmless.
//
// An attempt whose runner took a job that is still in progress is refused
// unless force: releasing it would tear down a VM running a job.
func ReleaseAttempt(ctx context.Context, js jetstream.JetStream, attempt string, force bool) (string, error) {
	f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
	if err != nil {
		return "", err
	}
	a := f.Attempts[attempt]
	if a == nil {
		return "", fmt.Errorf("no attempt %q in the log (attempt ids look like berth-<job id>-<n>; `berth status` lists the ones holding slots)", attempt)
	}
	if bound := f.BoundJob(a.ID); bound != 0 && !force {
		if j := f.Jobs[bound]; j != nil && j.Status == events.StatusInProgress {
			return "", fmt.Errorf("attempt %s is running job %d (in progress): releasing it would stop that job; wait for it, or pass --force", a.ID, bound)
		}
	}
	app := &eventlog.Appender{JS: js, Source: "berth/cli/" + Operator(), Role: events.RoleCLI}
	now := time.Now().UTC()
	var done []string
	if a.Held() {
		var expect uint64
		if p := f.Pools[a.Pool]; p != nil {
			expect = p.LastSeq
		}
		rel := events.SlotReleased{Pool: a.Pool, Host: a.Host, Attempt: a.ID, Reason: events.ReleaseOperator, JobID: a.JobID}
		if _, err := app.AppendConfirmed(ctx, app.New(now, rel), &expect); err != nil {
			return "", fmt.Errorf("release %s: %w (the pool's ledger moved; run the command again)", a.ID, err)
		}
		done = append(done, "slot of pool "+a.Pool+" released")
	}
	if a.Placed && !a.TeardownReq && !a.Stopped {
		td := events.AttemptTeardownRequested{AttemptRef: events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host},
			Reason: events.ReleaseOperator}
		if _, err := app.AppendConfirmed(ctx, app.New(now, td), nil); err != nil {
			return "", err
		}
		done = append(done, "teardown requested on "+a.Host)
	}
	if len(done) == 0 {
		return "nothing to do: it holds no slot and its VM is already being torn down or stopped", nil
	}
	return strings.Join(done, "; "), nil
}

// hostReason is why the host takes no new jobs: its cordon's reason, else
// its drain's.
func hostReason(h events.HostStatus) string {
	if h.CordonReason != "" {
		return h.CordonReason
	}
	return h.DrainReason
}
