package natsembed_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/natsembed"
)

// Given an address another process listens on, when the embedded server
// is asked to start there, then it refuses at once (not after the 10 s
// readiness wait) saying the address is taken and how to pick another.
func TestATakenAddressIsReportedAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start := time.Now()
	s, err := natsembed.StartEmbedded(natsembed.EmbeddedConfig{Listen: ln.Addr().String(), StoreDir: t.TempDir()})
	if err == nil {
		s.Shutdown()
		s.WaitForShutdown()
		t.Fatal("started on a taken address")
	}
	if took := time.Since(start); took > 5*time.Second || !strings.Contains(err.Error(), "--nats-listen") || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("after %s: %v; want at once, naming the address and --nats-listen", took, err)
	}
}
