package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reading without a consumer. Replays, `berth events` and `berth status`
// read the log with batched direct gets: one request to
// $JS.API.DIRECT.GET.<stream> with {"seq", "next_by_subj", "batch"} answers
// up to a batch of stored messages, each with Nats-Sequence and
// Nats-Subject headers, then an end-of-batch message (status 204 "EOB",
// with Nats-Num-Pending). That is JetStream's batched direct get (ADR-31,
// nats-server 2.11 and later; the stream allows direct gets). So a reader
// of the whole log (the cli, the admin, a replay in a service) holds no
// right to create, inspect, pull from or delete any consumer: those rights
// are granted only by exact name to the services that own them (natsauth).

// numPendingHeader: how many matching messages the stream holds after this
// one (or, on the end of batch, after the batch).
const numPendingHeader = "Nats-Num-Pending"

// pageSize is how many facts one direct get asks for.
const pageSize = 1000

// pageTimeout bounds one page: the request and every message of its answer.
const pageTimeout = 10 * time.Second

// ErrDirectGet marks an answer of the server's direct get that is not a
// stored message, an end of batch or "no message".
var ErrDirectGet = errors.New("direct get refused")

// directReq is JSApiMsgGetRequest's batched form (nats-server
// server/jetstream_api.go).
type directReq struct {
	Seq     uint64 `json:"seq"`
	NextFor string `json:"next_by_subj"`
	Batch   int    `json:"batch"`
}

// pager asks for pages, one after another, on one inbox: a subscription
// costs nats.go a buffer of 64k message slots, so a scan keeps one
// rather than making one per page.
type pager struct {
	nc    *nats.Conn
	inbox string
	sub   *nats.Subscription
}

func newPager(nc *nats.Conn) (*pager, error) {
	inbox := nc.NewInbox() // under the role's own inbox prefix
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1) // a page is bounded by pageSize; never drop part of it
	return &pager{nc: nc, inbox: inbox, sub: sub}, nil
}

func (p *pager) close() { _ = p.sub.Unsubscribe() }

// page is one batched direct get: the facts matching filter from seq on
// (at most batch), and how many more the stream holds after them. Pages
// are asked one at a time: a page that failed leaves the pager unusable
// (part of its answer may still arrive), so the caller stops there.
func (p *pager) page(ctx context.Context, stream, filter string, seq uint64, batch int) ([]Delivered, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, pageTimeout)
	defer cancel()
	nc, sub := p.nc, p.sub
	body, _ := json.Marshal(directReq{Seq: max(seq, 1), NextFor: filter, Batch: batch})
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, p.inbox, body); err != nil {
		return nil, 0, err
	}
	out := make([]Delivered, 0, batch)
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("direct get of %s from seq %d: %w", stream, seq, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // end of batch
			pending, _ := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64)
			return out, pending, nil
		case "404": // nothing stored at or after seq
			return out, 0, nil
		default:
			return nil, 0, fmt.Errorf("%w: %s %s (seq %d, filter %s)", ErrDirectGet, status, m.Header.Get("Description"), seq, filter)
		}
		s, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: an answer without %s", ErrDirectGet, jetstream.SequenceHeader)
		}
		ev, derr := events.Unmarshal(m.Data, s)
		ev.Seq, ev.Subject = s, m.Header.Get(jetstream.SubjectHeader) // the stored subject is authoritative
		if at, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer)); err == nil {
			ev.ClampToStored(at) // the log's clock, not the writer's
		}
		pending, _ := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64)
		out = append(out, Delivered{Event: ev, Pending: pending, Err: derr})
	}
}

// Scan calls fn, in log order, for every stored fact matching filter (one
// subject, wildcards allowed) from sequence from through upTo (0: up to
// what is stored when the last page is asked). It returns the sequence to
// scan from next time (after the last fact it read, or from itself when it
// read none) and fn's first error. No consumer is made: see the top of
// this file.
func Scan(ctx context.Context, js jetstream.JetStream, filter string, from, upTo uint64, fn func(Delivered) error) (uint64, error) {
	next := max(from, 1)
	pages, stop := prefetch(ctx, js.Conn(), filter, next, upTo)
	defer stop()
	for pg := range pages {
		if pg.err != nil {
			return next, pg.err
		}
		if err := ctx.Err(); err != nil {
			return next, err // a page fetched before the end: not read
		}
		for _, d := range pg.facts {
			if upTo > 0 && d.Event.Seq > upTo {
				return next, nil
			}
			if err := fn(d); err != nil {
				return next, err
			}
			next = d.Event.Seq + 1
		}
	}
	return next, nil
}

// fetched is one page as prefetch hands it on.
type fetched struct {
	facts []Delivered
	err   error
}

// prefetch asks for the pages of a scan one ahead of the reader: the
// server reads the next page, and this goroutine decodes it, while the
// reader folds the current one (a replay on two cores was a third server,
// a third decode and a third fold, one after the other). It stops after
// the page that reaches upTo or leaves nothing pending, after an error, or
// when stop is called. Only stop (the reader is gone) ends it without
// handing on its error: the end of ctx is an error the reader must get,
// or a cancelled scan would look complete. A filter of the whole log
// (events.SubjectAll, the stream's only subject) is sent as none: the
// server then steps through the log without matching each fact's subject.
func prefetch(ctx context.Context, nc *nats.Conn, filter string, from, upTo uint64) (<-chan fetched, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	stop := sync.OnceFunc(func() { close(stopped); cancel() })
	if filter == events.SubjectAll {
		filter = ""
	}
	out := make(chan fetched, 1)
	hand := func(f fetched) bool {
		select {
		case out <- f:
			return true
		case <-stopped:
			return false
		}
	}
	go func() {
		defer close(out)
		p, err := newPager(nc)
		if err != nil {
			hand(fetched{err: err})
			return
		}
		defer p.close()
		next := from
		for {
			ds, pending, err := p.page(ctx, events.StreamName, filter, next, pageSize)
			if !hand(fetched{facts: ds, err: err}) {
				return
			}
			if err != nil || pending == 0 || len(ds) == 0 {
				return
			}
			next = ds[len(ds)-1].Event.Seq + 1
			if upTo > 0 && next > upTo {
				return
			}
		}
	}()
	return out, stop
}

// ErrNotAt: no fact matching the filter is stored at the sequence asked
// for (it expired, or another subject's fact stands there).
var ErrNotAt = errors.New("no such fact at that sequence")

// At reads the one fact stored at seq, which must match filter (a direct
// get of one message: a reader with rights to read filter's subjects may
// read it, and no other subject's fact). A fact this build cannot decode
// comes back with its decoding error in Delivered.Err; none at seq is
// ErrNotAt.
func At(ctx context.Context, js jetstream.JetStream, filter string, seq uint64) (Delivered, error) {
	p, err := newPager(js.Conn())
	if err != nil {
		return Delivered{}, err
	}
	defer p.close()
	ds, _, err := p.page(ctx, events.StreamName, filter, seq, 1)
	if err != nil {
		return Delivered{}, err
	}
	if len(ds) == 0 || ds[0].Event.Seq != seq {
		return Delivered{}, fmt.Errorf("%w: seq %d on %s", ErrNotAt, seq, filter)
	}
	return ds[0], nil
}
