package eventlog_test

import (
	"errors"
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// An agent may not read the log's stream info (issue 16, F2): given no
// stream, StreamThere says it is missing; given the stream, it is there
// whether or not the subject holds a fact, and LastOn reads the last fact
// on a subject (wildcards allowed) with its stored subject and sequence.
func TestLastOnAndStreamThereNeedNoStreamInfo(t *testing.T) {
	_, js, _ := testkit.NATS(t)
	ctx := ctxFor(t)
	host := events.HostFilter("host-a")
	if err := eventlog.StreamThere(ctx, js, host); !errors.Is(err, eventlog.ErrStreamMissing) {
		t.Fatalf("no stream: %v, want ErrStreamMissing", err)
	}
	testkit.Stream(t, js, eventlog.StreamConfig{})
	if err := eventlog.StreamThere(ctx, js, host); err != nil {
		t.Fatalf("an empty stream: %v, want it there", err)
	}
	if _, err := eventlog.LastOn(ctx, js, host); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("nothing on %s: %v, want ErrMsgNotFound", host, err)
	}
	app := &eventlog.Appender{JS: js, Source: "test", Role: events.RoleAgent}
	var last uint64
	for _, p := range []events.Payload{events.HostOnline{Host: "host-a", Boot: "1"}, events.HostOnline{Host: "host-b", Boot: "1"},
		events.HostDraining{HostChange: events.HostChange{Host: "host-a"}}, events.HostOnline{Host: "host-b", Boot: "2"}} {
		seq, _, err := app.Append(ctx, app.New(t0, p), nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.EventType() == events.TypeHostDraining {
			last = seq
		}
	}
	m, err := eventlog.LastOn(ctx, js, host)
	if err != nil || m.Seq != last || m.Subject != events.HostSubject("host-a")+".agent" || m.Time.IsZero() {
		t.Fatalf("last on %s: %+v %v, want seq %d on host-a's agent subject with the server's time", host, m, err, last)
	}
}
