package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Probe is a consumer of the job facts beside the dispatcher's, on the
// same server: when it receives a job's queued fact, the log has handed
// that fact to its consumers. Queued stored → received is NATS's delivery
// (the server signalling its consumers, and the message's way to the
// client); received → slot reserved stored is Berth's own share of the
// dispatch latency: its fold, its Decide and its reservation's append.
// The dispatcher's consumer is signalled in the same pass as the probe's.
type Probe struct {
	mu       sync.Mutex
	received map[int64]time.Time // job id → its queued fact received
	stop     func()
}

// StartProbe follows the job facts stored after seq from.
func StartProbe(ctx context.Context, js jetstream.JetStream, from uint64) (*Probe, error) {
	p := &Probe{received: map[int64]time.Time{}}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.SubjectPrefix + ".job.>"}}
	stop, err := tail(ctx, js, cfg, from, func(msg jetstream.Msg, at time.Time) {
		if FactType(msg.Data()) != events.TypeJobQueued {
			return
		}
		ev, err := events.Unmarshal(msg.Data(), 0)
		q, ok := ev.Data.(*events.JobQueued)
		if err != nil || !ok {
			return
		}
		p.mu.Lock()
		if _, seen := p.received[q.JobID]; !seen {
			p.received[q.JobID] = at
		}
		p.mu.Unlock()
	}, func(error) {}) // a probe that stops early leaves jobs out of the split, and says so by their number
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	p.stop = stop
	return p, nil
}

// Stop ends the probe and returns when and which job facts it received.
func (p *Probe) Stop() map[int64]time.Time {
	p.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.received
}

// DeliveryParts splits accepted → slot reserved at the probe's receipt of
// each job's queued fact: NATS's delivery, then Berth's own share. A
// reservation stored before the probe got the fact (the dispatcher's
// consumer was served first) counts as a share of 0; early says how many.
func (tl Timeline) DeliveryParts(received map[int64]time.Time) (delivery, berth []time.Duration, early int) {
	for id, j := range tl.Jobs {
		at, ok := received[id]
		if !ok || j.Queued.IsZero() || j.Reserved.IsZero() {
			continue
		}
		delivery = append(delivery, max(at.Sub(j.Queued), 0))
		share := j.Reserved.Sub(at)
		if share < 0 {
			share, early = 0, early+1
		}
		berth = append(berth, share)
	}
	return delivery, berth, early
}
