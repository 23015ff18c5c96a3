package harness_test

import (
	"strings"
	"testing"

	"github.com/berth-ci/berth/tests/harness"
)

// Given a finished demo that was not kept, when its NATS listened on a
// free port because 4222 was taken, then the closing hint says to run the
// next one with -nats-listen too and names no port of the system that just
// ended; on the default port it gives the port, which the next run reuses.
func TestTheDemosHintFitsThePortItRanOn(t *testing.T) {
	var random, fixed strings.Builder
	harness.PrintSummary(&random, harness.Report{NATSURL: "nats://127.0.0.1:33049"}, false)
	harness.PrintSummary(&fixed, harness.Report{NATSURL: harness.DefaultNATSURL}, false)
	if s := random.String(); !strings.Contains(s, "DEMO_FLAGS='-keep -nats-listen=127.0.0.1:0'") || strings.Contains(s, "33049") {
		t.Fatalf("on a free port, the hint does not carry -nats-listen or names the ended run's port:\n%s", s)
	}
	if s := fixed.String(); !strings.Contains(s, "DEMO_FLAGS=-keep`") || !strings.Contains(s, "--server "+harness.DefaultNATSURL) {
		t.Fatalf("on the default port, the hint lacks -keep or the port:\n%s", s)
	}
}
