package main

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/spf13/cobra"
)

// completeWait bounds a completion's read of the log: a shell waits on it.
const completeWait = 3 * time.Second

// Kinds of names completion offers, read from the log's fold.
const (
	nameHost    = "host"
	namePool    = "pool"
	nameAttempt = "attempt"
	nameJob     = "job"
)

// fleetNames lists the names of kind the log holds, sorted (jobs newest
// first, at most 50), or none when NATS does not answer in completeWait.
func fleetNames(ctx context.Context, natsURL, kind string) []string {
	if checkNATSURL(natsURL) != nil {
		return nil
	}
	run.ClientNKey, run.ClientCreds = os.Getenv("BERTH_NATS_NKEY"), os.Getenv("BERTH_NATS_CREDS")
	ctx, cancel := context.WithTimeout(ctx, completeWait)
	defer cancel()
	type result struct{ f *events.Fleet }
	done := make(chan result, 1)
	go func() {
		closeNC, js, err := run.JetStream(natsURL)
		if err != nil {
			done <- result{}
			return
		}
		defer closeNC()
		f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
		if err != nil {
			f = nil
		}
		done <- result{f}
	}()
	var f *events.Fleet
	select {
	case r := <-done:
		f = r.f
	case <-ctx.Done():
	}
	if f == nil {
		return nil
	}
	return namesOf(f, kind)
}

// namesOf is the names of kind in f.
func namesOf(f *events.Fleet, kind string) []string {
	var out []string
	switch kind {
	case nameHost:
		for h := range f.Hosts {
			out = append(out, h)
		}
	case namePool:
		for p := range f.PoolLabels() {
			out = append(out, p)
		}
	case nameAttempt:
		for a := range f.Attempts {
			out = append(out, a)
		}
	case nameJob:
		jobs := make([]*events.Job, 0, len(f.Jobs))
		for _, j := range f.Jobs {
			jobs = append(jobs, j)
		}
		sort.Slice(jobs, func(i, k int) bool { return jobs[i].QueuedAt.After(jobs[k].QueuedAt) })
		for i, j := range jobs {
			if i == 50 {
				break
			}
			out = append(out, strconv.FormatInt(j.ID, 10))
		}
		return out
	}
	sort.Strings(out)
	return out
}

// completeNames completes with the log's names of kind that start with
// what is typed.
func completeNames(natsURL *string, kind string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, typed string) ([]string, cobra.ShellCompDirective) {
		var out []string
		for _, n := range fleetNames(cmd.Context(), *natsURL, kind) {
			if strings.HasPrefix(n, typed) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// firstArg completes only a command's first positional argument.
func firstArg(f func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective)) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, typed string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return f(cmd, args, typed)
	}
}
