package main

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary runs as ghsim when GHSIM_MAIN is set, so the tests below
// drive the real command line in a process of its own.
func TestMain(m *testing.M) {
	if os.Getenv("GHSIM_MAIN") == "1" {
		os.Args = append([]string{"ghsim"}, strings.Fields(os.Getenv("GHSIM_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ghsimServe starts `ghsim serve` with no jobs and args, and returns the
// process, its API's URL and its output's remaining lines.
func ghsimServe(t *testing.T, ctx context.Context, args string) (*exec.Cmd, string, *bufio.Scanner) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GHSIM_MAIN=1",
		"GHSIM_ARGS=serve --listen 127.0.0.1:0 --jobs 0 --fixtures ../../../../shared/fixtures/github "+args)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	url := regexp.MustCompile(`serving GitHub API at (\S+)`)
	for sc.Scan() {
		if m := url.FindStringSubmatch(sc.Text()); m != nil {
			return cmd, m[1], sc
		}
	}
	t.Fatalf("ghsim serve printed no API address (%v)", sc.Err())
	return nil, "", nil
}

// until reads sc's lines until one contains want, failing at the end.
func until(t *testing.T, sc *bufio.Scanner, want string) {
	t.Helper()
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return
		}
	}
	t.Fatalf("ghsim serve ended without printing %q", want)
}

// Found by a new user: `ghsim serve` exits once its jobs are done, taking
// the API away from whoever still reads it. Given --stay, when all jobs
// completed, then it goes on answering until SIGINT, and then exits 0;
// without it, it says how to stay and exits 0.
func TestServeStaysUntilInterruptedWhenAsked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cmd, url, sc := ghsimServe(t, ctx, "--stay")
	until(t, sc, "serving on until Ctrl-C")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("after all jobs completed, with --stay, the API at %s does not answer: %v", url, err)
	}
	resp.Body.Close()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("ghsim serve --stay after SIGINT: %v; want exit 0", err)
	}

	cmd, _, sc = ghsimServe(t, ctx, "")
	until(t, sc, "--stay keeps serving")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("ghsim serve without --stay: %v; want exit 0 once all jobs completed", err)
	}
}
