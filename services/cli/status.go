// Package cli implements the berth command's operator verbs.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// FleetStatus replays the log and reads the heartbeat bucket: the
// `berth status` view. It needs no running dispatcher, only NATS.
func FleetStatus(ctx context.Context, js jetstream.JetStream) (events.Status, error) {
	f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
	if err != nil {
		return events.Status{}, err
	}
	return statusOf(ctx, js, f), nil
}

// WatchStatus prints the status every interval until ctx ends, folding only
// the facts stored since the last print (one replay at start). On a
// terminal (clear) each print replaces the last; otherwise prints follow
// each other, separated by a blank line (JSON: one object per print).
func WatchStatus(ctx context.Context, js jetstream.JetStream, w io.Writer, every time.Duration, asJSON, clear bool) error {
	f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
	if err != nil {
		return err
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if clear {
			fmt.Fprint(w, "\033[H\033[2J") // home, clear screen
		}
		if err := PrintStatus(w, statusOf(ctx, js, f), asJSON, time.Now()); err != nil {
			return err
		}
		if !clear && !asJSON {
			fmt.Fprintln(w)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := eventlog.CatchUp(ctx, js, f); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// statusOf is f's status with each host's last heartbeat, and its agent's
// clock skew against the NATS server that stored it.
func statusOf(ctx context.Context, js jetstream.JetStream, f *events.Fleet) events.Status {
	return WithHeartbeats(ctx, js, f.Status())
}

// WithHeartbeats is st with each host's last heartbeat and clock skew read
// from the heartbeat bucket (heartbeats are not events), and empty (not
// nil) lists: what `berth status --json` prints for a fold's Status. The
// dispatcher's page uses it too, so both show one projection.
func WithHeartbeats(ctx context.Context, js jetstream.JetStream, st events.Status) events.Status {
	if kv, err := js.KeyValue(ctx, events.BucketHeartbeats); err == nil {
		for i, h := range st.Hosts {
			e, err := kv.Get(ctx, h.Name)
			if err != nil {
				continue
			}
			var hb events.Heartbeat
			if json.Unmarshal(e.Value(), &hb) == nil {
				at, skew := hb.At, hb.At.Sub(e.Created()).Seconds()
				st.Hosts[i].LastHeartbeat, st.Hosts[i].ClockSkewSeconds = &at, &skew
			}
		}
	}
	if st.Pools == nil {
		st.Pools = []events.PoolStatus{}
	}
	if st.Hosts == nil {
		st.Hosts = []events.HostStatus{}
	}
	return st
}

// PrintStatus writes the status as JSON or as tables.
func PrintStatus(w io.Writer, st events.Status, asJSON bool, now time.Time) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tCAPACITY\tHELD\tRUNNING\tPROVISIONING\tWARM(booting/idle/assigned)\tPENDING\tWAITING\tABANDONED\tCORDONED\tALARMS")
	for _, p := range st.Pools {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d/%d/%d\t%d\t%d\t%d\t%s\t%d\n", p.Name, p.Capacity, p.Held, p.Running, p.Provisioning,
			p.WarmWarming, p.WarmIdle, p.WarmAssigned, p.PendingDemand, p.WaitingForSlot, p.AbandonedVMs, dash(strings.Join(p.CordonedHosts, ",")), len(p.Alarms))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "HOST\tSTATE\tCORDONED\tREASON\tPHYSICAL_CAP\tLIVE_VMS\tABANDONED\tSLOTS(held/total)\tLAST_HEARTBEAT")
	for _, h := range st.Hosts {
		var slots []string
		for pool, n := range h.Slots {
			slots = append(slots, fmt.Sprintf("%s %d/%d", pool, h.Held[pool], n))
		}
		sort.Strings(slots)
		hb := "never"
		if h.LastHeartbeat != nil {
			hb = now.Sub(*h.LastHeartbeat).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%d\t%d\t%d\t%s\t%s\n", h.Name, h.State, h.Cordoned, dash(hostReason(h)), h.PhysicalCap, h.LiveVMs, h.AbandonedVMs,
			strings.Join(slots, ", "), hb)
	}
	fmt.Fprintln(tw)
	j := st.Jobs
	fmt.Fprintf(tw, "jobs: %d queued, %d waiting, %d in progress, %d completed, %d unschedulable, %d unmatched (as of seq %d)\n",
		j.Queued, j.Waiting, j.InProgress, j.Completed, j.Unschedulable, j.Unmatched, st.AsOfSeq)
	for _, p := range st.Pools {
		for _, h := range p.HeldBy {
			bound := "-"
			if h.Bound != 0 {
				bound = fmt.Sprint(h.Bound)
			}
			fmt.Fprintf(tw, "  held %s: attempt %s on %s, %s, %s, running job %s\n", p.Name, h.Attempt, h.Host, h.Stage, bookedFor(h.JobID), bound)
		}
	}
	for _, h := range st.Hosts {
		if h.Degraded {
			fmt.Fprintf(tw, "DEGRADED %s (%s): %s\n", h.Name, h.DegradedCulprit, h.DegradedReason)
		}
		if len(h.Overclaim) > 0 {
			fmt.Fprintf(tw, "OVERCLAIM %s: offered only its grant (%s); grant it if right: %s (docs/runbooks.md#host-overclaim)\n",
				h.Name, strings.Join(h.Overclaim, "; "), events.OverclaimCommand(h.Name))
		}
	}
	if g := st.GitHub; g.Refused && g.Since != nil {
		fmt.Fprintf(tw, "GITHUB refused the App's credentials since %s: calls pause, jobs wait as demand (docs/runbooks.md#github-refused)\n",
			g.Since.Format(time.RFC3339))
	}
	for _, a := range st.Alarms {
		fmt.Fprintf(tw, "ALARM %s (%s): %s\n", a.Key, a.Pool, a.Message)
	}
	for _, d := range st.StreamDrift {
		fmt.Fprintf(tw, "STREAM DRIFT %s: %s (the admin fixes it with `berth stream apply`)\n", events.StreamName, d)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// bookedFor says whom a held slot was booked for: a job, or (job id 0) the
// warm pool, whose VMs boot before any job names them.
func bookedFor(job int64) string {
	if job == 0 {
		return "a warm VM (no job yet)"
	}
	return fmt.Sprintf("booked for job %d", job)
}
