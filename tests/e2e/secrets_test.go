package e2e

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/tests/harness"
	"github.com/nats-io/nats.go/jetstream"
)

// lockedBuffer collects the services' logs from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Given a run of real jobs with every service logging at debug level, when
// the whole stream, every KV bucket and the logs are scanned for every JIT
// config GitHub minted (and the runner token inside it), then none appears
// in clear: the dispatcher seals each to its agent's curve key before it
// reaches the log (issue 7, sealed secrets).
func TestNoJITConfigAppearsInClearInTheLogKVOrServiceLogs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logs := &lockedBuffer{}
	o := demoOptions(t, 20)
	o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := f.Drive(ctx, o)
	if err != nil {
		f.Stop()
		t.Fatal(err)
	}
	secrets := f.Sim.MintedSecrets()
	stored := readEverything(t, ctx, f.Sys.NATSURL)
	if err := f.Stop(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if rep.Served != o.Jobs {
		t.Fatalf("served %d of %d jobs", rep.Served, o.Jobs)
	}
	if len(secrets) < 2*o.Jobs {
		t.Fatalf("%d secrets minted for %d jobs: the scan would prove nothing", len(secrets), o.Jobs)
	}
	// The scan reads real data: the placements (carrying the sealed configs)
	// are there, and the debug logs.
	if !strings.Contains(stored, "berth.attempt.placed.v1") || !strings.Contains(logs.String(), "appended") {
		t.Fatalf("the scan does not see the stream or the debug logs (%d bytes stored, %d of logs)", len(stored), len(logs.String()))
	}
	for _, s := range secrets {
		if strings.Contains(stored, s) {
			t.Errorf("a minted secret (%.12s…) is stored in clear in NATS", s)
		}
		if strings.Contains(logs.String(), s) {
			t.Errorf("a minted secret (%.12s…) is in the services' logs", s)
		}
	}
}

// readEverything returns every stored byte: each message of the stream and
// the current value of every key of every KV bucket.
func readEverything(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	nc, js, err := eventlog.Connect(url, "scan")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var all strings.Builder
	cons, err := js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last, err := eventlog.LastSeq(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(0); seq < last; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			meta, _ := m.Metadata()
			seq = meta.Sequence.Stream
			all.Write(m.Data())
			n++
		}
		if n == 0 {
			t.Fatalf("reading the stream stalled at seq %d of %d", seq, last)
		}
	}
	for name := range js.KeyValueStoreNames(ctx).Name() {
		kv, err := js.KeyValue(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.Keys(ctx)
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if e, err := kv.Get(ctx, k); err == nil {
				all.Write(e.Value())
			}
		}
	}
	return all.String()
}
