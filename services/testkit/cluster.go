package testkit

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClusterSize is the node count of the shipped cluster (deploy/nats/cluster).
const ClusterSize = 3

// Cluster starts the nodes of deploy/nats/cluster in this process, on
// loopback: each node's file is parsed as shipped (and checked to be the
// "berth" cluster with JetStream and a route per node), then its client and
// route ports move to free local ones and its store to a t.TempDir(). It
// returns once JetStream answers through every node (a meta leader is
// elected), with the servers in node order and the comma-separated client
// URLs; every node is shut down at cleanup. n must be ClusterSize.
func Cluster(t testing.TB, n int) ([]*server.Server, string) {
	t.Helper()
	if n != ClusterSize {
		t.Fatalf("testkit.Cluster(%d): deploy/nats/cluster ships %d nodes", n, ClusterSize)
	}
	return cluster(t, n, FreePort, 10*time.Second)
}

// cluster starts n nodes on ports from port, giving each node up to ready
// to accept connections before it starts them all again.
func cluster(t testing.TB, n int, port func(testing.TB) int, ready time.Duration) ([]*server.Server, string) {
	t.Helper()
	// A port FreePort found free can be taken before its node binds it (by
	// another test process, or as the local port of an outgoing
	// connection): the node then never gets ready. Fresh ports fix that.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		servers, urls, err := startNodes(t, n, port, ready)
		if err == nil {
			for i, u := range urls {
				EventuallyErr(t, 30*time.Second, fmt.Sprintf("JetStream through node %d", i+1), func() error { return JetStreamReady(u) })
			}
			return servers, strings.Join(urls, ",")
		}
		if attempt == attempts {
			t.Fatalf("%v, %d times with fresh ports: is the machine overloaded?", err, attempts)
		}
		t.Logf("%v; starting the cluster again on fresh ports", err)
	}
}

// startNodes starts the n nodes on fresh ports; if one is not ready for
// connections within ready it shuts down those it started and says which.
func startNodes(t testing.TB, n int, port func(testing.TB) int, ready time.Duration) ([]*server.Server, []string, error) {
	t.Helper()
	routePorts := make([]int, n)
	var routes []*url.URL
	for i := range routePorts {
		routePorts[i] = port(t)
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", routePorts[i])})
	}
	var servers []*server.Server
	var urls []string
	for i := range n {
		file := filepath.Join(RepoRoot(t), "deploy", "nats", "cluster", fmt.Sprintf("nats-%d.conf", i+1))
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if opts.Cluster.Name != "berth" || !opts.JetStream || len(opts.Routes) != n {
			t.Fatalf("%s: cluster %q, jetstream %v, %d routes", file, opts.Cluster.Name, opts.JetStream, len(opts.Routes))
		}
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", port(t), 0
		opts.Cluster.Host, opts.Cluster.Port, opts.Routes = "127.0.0.1", routePorts[i], routes
		opts.StoreDir, opts.NoLog, opts.NoSigs = t.TempDir(), true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers = append(servers, s)
		if !s.ReadyForConnections(ready) {
			for _, s := range servers {
				s.Shutdown()
			}
			return nil, nil, fmt.Errorf("node %d not ready for connections within %s (client port %d, route port %d)", i+1, ready, opts.Port, routePorts[i])
		}
		urls = append(urls, s.ClientURL())
	}
	return servers, urls, nil
}

// JetStreamReady asks for the account's JetStream info through url (with
// the client options opts): nil once the server, or the cluster's meta
// leader, answers.
func JetStreamReady(url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(time.Second)}, opts...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// RepoRoot is the repository's top directory (where go.work is), found
// from this source file's place in it (services/testkit).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("testkit: no source path to find the repository from")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}
