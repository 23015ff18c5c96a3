package procs

import (
	"fmt"
	"github.com/berth-ci/berth/services/testkit"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/natsauth"
	"github.com/nats-io/nats.go"
)

// NATS is a nats-server process, or a cluster of them, each with its own
// JetStream store that survives its restarts.
type NATS struct {
	Nodes []*Proc
	URLs  []string
	// ClientOpts authenticate the harness's own connections (the cli
	// user's nkey when the system runs with per-service auth).
	ClientOpts []nats.Option
}

// URL is the client URL list services dial (comma-separated).
func (n *NATS) URL() string { return strings.Join(n.URLs, ",") }

// startNATS starts n nodes (1, or 3 for a cluster named berth like
// deploy/nats/cluster) on free loopback ports and waits until JetStream
// answers through every node.
func startNATS(t *testing.T, bin, dir, tag string, n int, auth *natsauth.Auth, clientOpts []nats.Option) *NATS {
	t.Helper()
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := range n {
		clientPorts[i], routePorts[i] = freePort(t), freePort(t)
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	out := &NATS{ClientOpts: clientOpts}
	for i := range n {
		name := fmt.Sprintf("nats-%d", i+1)
		store := filepath.Join(dir, name, "jetstream")
		if err := os.MkdirAll(store, 0o755); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\nmax_payload: 4MB\njetstream {\n  store_dir: %q\n}\n", name, clientPorts[i], store)
		if n > 1 {
			conf += fmt.Sprintf("cluster {\n  name: berth\n  listen: 127.0.0.1:%d\n  routes: [\n    %s\n  ]\n}\n", routePorts[i], strings.Join(routes, "\n    "))
		}
		if auth != nil {
			// Beside nats.conf: an include is relative to the including file.
			if err := os.WriteFile(filepath.Join(dir, name, "auth.conf"), []byte(auth.Config()), 0o644); err != nil {
				t.Fatal(err)
			}
			conf += "include auth.conf\n"
		}
		confPath := filepath.Join(dir, name, "nats.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		p := newProc(name, filepath.Join(dir, name+".log"), dir, []string{tagEnv + "=" + tag}, bin, "-c", confPath)
		if err := p.start(nil); err != nil {
			t.Fatal(err)
		}
		out.Nodes = append(out.Nodes, p)
		out.URLs = append(out.URLs, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
	}
	for i := range n {
		out.AwaitJetStream(t, i, 30*time.Second)
	}
	return out
}

// AwaitJetStream waits until JetStream answers an account-info request
// through node i (in a cluster: once a meta leader is elected).
func (n *NATS) AwaitJetStream(t testing.TB, i int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		if last = testkit.JetStreamReady(n.URLs[i], n.ClientOpts...); last == nil {
			return
		}
		if !n.Nodes[i].Running() {
			t.Fatalf("%s exited:\n%s", n.Nodes[i].Name, tail(n.Nodes[i].Log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: JetStream not ready within %s: %v\n%s", n.Nodes[i].Name, within, last, tail(n.Nodes[i].Log, 30))
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// freePort picks a port to listen on, and to listen on again after a
// restart: below Linux's ephemeral range (32768 and up), so that no
// outgoing connection is handed it while its process is down. It is
// reserved for this test binary across processes too (reservePort): two
// test binaries that restart their services (the chaos and the crash
// tests, or two chaos runs at once) each found a port free while the
// other's service was down, and one's restart then failed to listen.
func freePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		port := 20000 + rand.IntN(12000)
		if portsGiven[port] {
			continue // handed out already in this test binary
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		if !reservePort(port) {
			continue // another test binary holds it, its process down for now
		}
		portsGiven[port] = true
		return port
	}
	t.Fatal("no free port between 20000 and 32000")
	return 0
}

// portsDir holds one file per port a running test binary reserved, named
// after the port and holding its pid.
var portsDir = filepath.Join(os.TempDir(), "berth-procs-ports")

// reservePort claims port for this process unless a live process holds
// it; a claim whose process is gone (a killed test binary) is taken over.
// Main releases this process's claims.
func reservePort(port int) bool {
	if err := os.MkdirAll(portsDir, 0o755); err != nil {
		return true // no place to reserve in: pick as before
	}
	path := filepath.Join(portsDir, strconv.Itoa(port))
	me := []byte(strconv.Itoa(os.Getpid()))
	for range 2 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, _ = f.Write(me)
			_ = f.Close()
			return true
		}
		owner, rerr := os.ReadFile(path)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(owner)))
		if rerr != nil || perr != nil || pid <= 0 || syscall.Kill(pid, 0) == nil {
			return false // held (or being written) by a live process
		}
		_ = os.Remove(path) // its process is gone
	}
	return false
}

// releasePorts removes this process's port claims.
func releasePorts() {
	portsMu.Lock()
	defer portsMu.Unlock()
	for port := range portsGiven {
		path := filepath.Join(portsDir, strconv.Itoa(port))
		if owner, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(owner)) == strconv.Itoa(os.Getpid()) {
			_ = os.Remove(path)
		}
	}
}

// StartCluster starts a bare cluster of n nats-server processes (no
// services, no authorization) for a test of how a client rides out a
// node's loss; every node is killed at cleanup.
func StartCluster(t *testing.T, n int) *NATS {
	t.Helper()
	b := Build(t)
	tagBytes := make([]byte, 8)
	for i := range tagBytes {
		tagBytes[i] = byte(rand.IntN(256))
	}
	tag := fmt.Sprintf("%x", tagBytes)
	t.Cleanup(func() { killTagged(tag) })
	out := startNATS(t, b.NATS, t.TempDir(), tag, n, nil, nil)
	t.Cleanup(func() {
		for _, p := range out.Nodes {
			p.Kill(t)
		}
	})
	return out
}
