package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/tests/ghsim"
)

// The world is the part of a fleet that is not Berth's control plane: the
// GitHub simulator and the hosts' agents with their in-process backends.
// In production GitHub is remote and every agent runs on its own host; in
// one process their heap (the simulator keeps every job and webhook, 500
// agents keep 500 connections and folds) is marked by the same collector
// as the dispatcher's, and its mark phases stall the dispatcher and the
// NATS server beside it. The scale phase therefore runs the world in a
// process of its own (Env.World), started from the bench binary's `world`
// mode and driven over a small HTTP API on loopback.

// WorldConfig is what the world process is started with, as JSON in its
// one argument.
type WorldConfig struct {
	NATSURL        string
	DispatcherAddr string // host:port the simulator sends webhooks to
	Secret         string // the webhook secret
	Fleet          FleetOptions
	// LogLevel of the agents' and the simulator's logs, to its stderr.
	LogLevel slog.Level
}

// WorldState is what the world process reports of itself.
type WorldState struct {
	RunnerFailures int
	// Heap and Objects are live heap bytes and objects, after two forced
	// GCs when asked for (?gc=1).
	Heap, Objects uint64
	Goroutines    int
	// CPU is the time (user and system) the world process has used.
	CPU time.Duration
}

// worldJobs is the simulator's view, for a stalled phase's diagnosis.
type worldJobs struct {
	Jobs    []ghsim.JobView
	Runners []ghsim.RunnerView
}

// worldAddrs is the world process's first line on stdout.
type worldAddrs struct{ Sim, Control string }

// ServeWorld is the world process: it starts the simulator, prints one
// JSON line {"Sim": API URL, "Control": control URL} on out, serves the
// control API until in reaches EOF (the bench closed its end or died) or
// ctx ends, then stops the agents and the simulator. Agents start on
// POST /agents, once the bench has applied the stream and started the
// dispatcher.
func ServeWorld(ctx context.Context, config string, in io.Reader, out io.Writer) error {
	var wc WorldConfig
	if err := json.Unmarshal([]byte(config), &wc); err != nil {
		return fmt.Errorf("world: bad config %q: %w", config, err)
	}
	o := wc.Fleet
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: wc.LogLevel}))
	dir, err := os.MkdirTemp("", "berth-bench-world-")
	if err != nil {
		return err
	}
	f := &Fleet{dir: dir, Hosts: o.Hosts, Sys: run.NewSystem()}
	f.Sys.NATSURL = wc.NATSURL
	defer f.Close()
	simURL, err := f.startSim(o, wc.DispatcherAddr, wc.Secret)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	cfg := fleetConfig(o, dir, wc.NATSURL, wc.DispatcherAddr, simURL, wc.Secret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: worldAPI(f, func() error { return f.startAgents(sctx, o, cfg) }), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	if err := json.NewEncoder(out).Encode(worldAddrs{Sim: simURL, Control: "http://" + ln.Addr().String()}); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() { io.Copy(io.Discard, in); close(eof) }()
	select {
	case <-eof:
	case <-ctx.Done():
	case <-f.Sys.Failed():
		return fmt.Errorf("world: an agent stopped: %w", f.Sys.Wait())
	}
	return nil
}

// worldAPI is the world process's control API.
func worldAPI(f *Fleet, startAgents func() error) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /agents", func(w http.ResponseWriter, r *http.Request) {
		reply(w, struct{}{}, startAgents())
	})
	mux.HandleFunc("POST /enqueue", func(w http.ResponseWriter, r *http.Request) {
		var s ghsim.JobSpec
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reply(w, f.Sim.Enqueue(s), nil)
	})
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("gc") == "1" {
			runtime.GC()
			runtime.GC()
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		reply(w, WorldState{RunnerFailures: f.RunnerFailures(), Heap: m.HeapAlloc, Objects: m.HeapObjects, Goroutines: runtime.NumGoroutine(), CPU: processCPU()}, nil)
	})
	mux.HandleFunc("GET /jobs", func(w http.ResponseWriter, r *http.Request) {
		if f.Sim == nil {
			reply(w, worldJobs{}, nil)
			return
		}
		reply(w, worldJobs{Jobs: f.Sim.Jobs(), Runners: f.Sim.Runners()}, nil)
	})
	mux.HandleFunc("POST /settle", func(w http.ResponseWriter, r *http.Request) {
		reply(w, struct{}{}, f.Settle(r.Context()))
	})
	var (
		profMu      sync.Mutex // handlers run concurrently
		stopProfile = func() {}
	)
	mux.HandleFunc("POST /cpuprofile", func(w http.ResponseWriter, r *http.Request) {
		profMu.Lock()
		defer profMu.Unlock()
		stop, err := cpuProfile(r.URL.Query().Get("file"))
		if err == nil {
			stopProfile = stop
		}
		reply(w, struct{}{}, err)
	})
	mux.HandleFunc("DELETE /cpuprofile", func(w http.ResponseWriter, r *http.Request) {
		profMu.Lock()
		defer profMu.Unlock()
		stopProfile()
		reply(w, struct{}{}, nil)
	})
	mux.HandleFunc("POST /close-sim", func(w http.ResponseWriter, r *http.Request) {
		if f.Sim != nil {
			f.Sim.Close()
			f.Sim = nil
		}
		reply(w, struct{}{}, nil)
	})
	return mux
}

// world is the bench's handle on a world process.
type world struct {
	cmd     *exec.Cmd
	stdin   io.Closer
	exited  chan struct{}
	control string
	http    *http.Client
}

// startWorld starts the world process (cmdline, then the config as one
// more argument) on at most procs cores (GOMAXPROCS; 0: every core) and
// returns it with the simulator's API URL, once the process has printed
// its addresses (within 30 s).
func startWorld(cmdline []string, procs int, wc WorldConfig) (*world, string, error) {
	b, err := json.Marshal(wc)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(cmdline[0], append(cmdline[1:len(cmdline):len(cmdline)], string(b))...)
	cmd.Stderr = os.Stderr
	if procs > 0 {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(procs))
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start the world process (%s): %w", cmdline[0], err)
	}
	w := &world{cmd: cmd, stdin: stdin, exited: make(chan struct{}), http: &http.Client{Timeout: time.Minute}}
	lines := make(chan []byte, 1)
	go func() {
		rd := bufio.NewReader(stdout)
		line, _ := rd.ReadBytes('\n')
		lines <- line
		io.Copy(io.Discard, rd)
		cmd.Wait()
		close(w.exited)
	}()
	var addrs worldAddrs
	select {
	case line := <-lines:
		if err := json.Unmarshal(line, &addrs); err != nil || addrs.Control == "" {
			w.close()
			return nil, "", fmt.Errorf("the world process printed %q, not its addresses (its stderr is above)", bytes.TrimSpace(line))
		}
	case <-time.After(30 * time.Second):
		w.close()
		return nil, "", errors.New("the world process printed no addresses within 30 s (its stderr is above)")
	}
	w.control = addrs.Control
	return w, addrs.Sim, nil
}

// close ends the world process: its stdin closes, and it stops its agents
// and simulator; after 30 s it is killed.
func (w *world) close() error {
	w.stdin.Close()
	select {
	case <-w.exited:
	case <-time.After(30 * time.Second):
		w.cmd.Process.Kill()
		<-w.exited
		return errors.New("the world process did not stop within 30 s of its stdin closing; killed")
	}
	if s := w.cmd.ProcessState; s != nil && !s.Success() {
		return fmt.Errorf("the world process: %s (its stderr is above)", s)
	}
	return nil
}

// call sends one control request; in, when not nil, is the JSON body, and
// out receives the JSON answer.
func (w *world) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, w.control+path, body)
	if err != nil {
		return err
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return fmt.Errorf("world %s %s: %w (did the world process exit? its stderr is above)", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("world %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// state reads the world's figures; with gc, after two forced GCs.
func (w *world) state(ctx context.Context, gc bool) (WorldState, error) {
	var s WorldState
	path := "/state"
	if gc {
		path += "?gc=1"
	}
	return s, w.call(ctx, http.MethodGet, path, nil, &s)
}
