// Command ghsim runs Berth's GitHub simulator (package ghsim) or plays one of its
// ephemeral JIT runners.
//
//	ghsim runner --jitconfig-file FILE      # like `run.sh --jitconfig <blob>`
//	ghsim serve --listen 127.0.0.1:9000 --webhook-url URL --secret S \
//	      --org O --repo R --fixtures DIR --jobs N --labels self-hosted,linux --duration 2s
//	ghsim exec create|stop|list             # the exec backend's steps, for a FROM-scratch agent image
//
// runner exits 0 after completing its one job, or when stopped by SIGTERM/SIGINT;
// 1 on any other failure. serve exits 0 once all N jobs completed, unless
// --stay keeps it serving (the API and its runners' JIT configs) until
// SIGTERM/SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/berth-ci/berth/tests/ghsim"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var err error
	switch os.Args[1] {
	case "runner":
		err = runner(ctx, log, os.Args[2:])
	case "serve":
		err = serve(ctx, log, os.Args[2:])
	case "exec":
		err = execStep(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ghsim:", err)
		stop()
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ghsim runner --jitconfig-file FILE | ghsim serve [flags] | ghsim exec create|stop|list  (-h for flags)")
	os.Exit(2)
}

func runner(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("runner", flag.ExitOnError)
	file := fs.String("jitconfig-file", "", "file holding the encoded_jit_config string")
	blob := fs.String("jitconfig", "", "the encoded_jit_config string itself (alternative to --jitconfig-file)")
	_ = fs.Parse(args)
	enc := *blob
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		enc = string(b)
	}
	enc = strings.TrimSpace(enc)
	if enc == "" {
		return errors.New("runner: --jitconfig-file or --jitconfig is required")
	}
	err := ghsim.RunRunner(ctx, enc, log)
	if err != nil && ctx.Err() != nil {
		log.Info("runner stopped by signal")
		return nil
	}
	return err
}

func serve(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:9000", "listen address")
	hook := fs.String("webhook-url", "", "where to POST workflow_job webhooks")
	secret := fs.String("secret", "", "webhook HMAC secret")
	org := fs.String("org", "example-org", "organization")
	repo := fs.String("repo", "example-repo", "repository")
	fixtures := fs.String("fixtures", "../shared/fixtures/github", "path to shared/fixtures/github")
	jobs := fs.Int("jobs", 1, "number of jobs to enqueue")
	labels := fs.String("labels", "self-hosted,linux", "comma-separated job labels")
	dur := fs.Duration("duration", 2*time.Second, "how long each job runs")
	public := fs.String("public-url", "", "base URL clients reach the sim by, put in JIT configs (e.g. http://sim:9000 on a compose network)")
	stay := fs.Bool("stay", false, "keep serving after all jobs completed, until Ctrl-C (default: exit 0)")
	waitFor := fs.String("wait-for", "", "enqueue only once GET on this URL answers 200 (e.g. the dispatcher's /healthz): GitHub does not retry a failed delivery")
	_ = fs.Parse(args)

	sim, err := ghsim.New(ghsim.Config{WebhookURL: *hook, WebhookSecret: *secret, Org: *org, Repo: *repo,
		FixturesDir: *fixtures, Logger: log, PublicURL: *public})
	if err != nil {
		return err
	}
	defer sim.Close()
	url, err := sim.Start(*listen)
	if err != nil {
		return err
	}
	fmt.Printf("ghsim: serving GitHub API at %s (org %s, repo %s)\n", url, *org, *repo)
	if *waitFor != "" {
		if err := waitHealthy(ctx, *waitFor); err != nil {
			return err
		}
	}
	for range *jobs {
		id := sim.Enqueue(ghsim.JobSpec{Labels: strings.Split(*labels, ","), Duration: *dur})
		fmt.Printf("ghsim: queued job %d\n", id)
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		counts := map[string]int{}
		for _, j := range sim.Jobs() {
			counts[j.Status]++
		}
		line := fmt.Sprintf("queued=%d in_progress=%d completed=%d runners=%d webhooks=%d",
			counts[ghsim.StatusQueued], counts[ghsim.StatusInProgress], counts[ghsim.StatusCompleted],
			len(sim.Runners()), len(sim.Deliveries()))
		if line != last {
			fmt.Println("ghsim:", line)
			last = line
		}
		if counts[ghsim.StatusCompleted] == *jobs && allDelivered(sim) {
			if !*stay {
				fmt.Println("ghsim: all jobs completed and webhooks delivered; exiting (--stay keeps serving)")
				return nil
			}
			fmt.Println("ghsim: all jobs completed and webhooks delivered; serving on until Ctrl-C (--stay)")
			<-ctx.Done()
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted before all jobs completed")
		case <-tick.C:
		}
	}
}

// allDelivered reports whether every webhook attempt has finished.
func allDelivered(sim *ghsim.Sim) bool {
	for _, d := range sim.Deliveries() {
		if !d.Done {
			return false
		}
	}
	return true
}

// waitHealthy polls url until it answers 200, printing progress every 5 s.
func waitHealthy(ctx context.Context, url string) error {
	start := time.Now()
	last := start
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fmt.Printf("ghsim: %s is healthy after %s\n", url, time.Since(start).Round(time.Second))
				return nil
			}
		}
		if time.Since(last) >= 5*time.Second {
			last = time.Now()
			fmt.Printf("ghsim: waiting for %s to be healthy (%s so far; last: %v)\n", url, time.Since(start).Round(time.Second), errOrStatus(err, resp))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never became healthy: %w", url, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func errOrStatus(err error, resp *http.Response) any {
	if err != nil {
		return err
	}
	return resp.Status
}
