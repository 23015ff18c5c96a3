package testkit

import (
	"net"
	"strings"
	"testing"
	"time"
)

// Given a port that another listener takes between FreePort finding it
// free and the node binding it (here: the second node's client port, on the
// first try), when the cluster is started, then it starts again on fresh
// ports and JetStream answers through every node.
func TestAClusterWhosePortWasTakenStartsOnFreshPorts(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	calls := 0
	port := func(t testing.TB) int {
		calls++
		// Three route ports, then node 1's client port, then node 2's.
		if calls == ClusterSize+2 {
			return taken.Addr().(*net.TCPAddr).Port
		}
		return FreePort(t)
	}
	servers, urls := cluster(t, ClusterSize, port, 2*time.Second)
	if len(servers) != ClusterSize || strings.Count(urls, ",") != ClusterSize-1 {
		t.Fatalf("%d servers, urls %q", len(servers), urls)
	}
	// The first try asks for three route ports and two client ports, the
	// second for three of each.
	if want := 3*ClusterSize + 2; calls != want {
		t.Fatalf("%d ports asked for, want %d: the cluster did not start again after node 2 could not bind", calls, want)
	}
	for _, s := range servers {
		if strings.Contains(s.ClientURL(), taken.Addr().String()) {
			t.Fatalf("node on the taken port %s", taken.Addr())
		}
	}
}
