package bench

import (
	"testing"
	"time"
)

// Given jobs' stored times and when a probe consumer received their queued
// facts, then accepted → reserved is split at the receipt: NATS's delivery
// before it, Berth's share after; a reservation stored before the receipt
// is a share of 0 and counted, and a job the probe never got is left out.
func TestDeliveryPartsSplitAtTheProbesReceipt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	tl := Timeline{Jobs: map[int64]*JobTimes{
		1: {Queued: t0, Reserved: ms(1)},
		2: {Queued: t0, Reserved: ms(0.2)},
		3: {Queued: t0, Reserved: ms(2)},
	}}
	delivery, berth, early := tl.DeliveryParts(map[int64]time.Time{1: ms(0.4), 2: ms(0.3)})
	if len(delivery) != 2 || len(berth) != 2 || early != 1 {
		t.Fatalf("delivery %v, berth %v, early %d; want two jobs, one early", delivery, berth, early)
	}
	got := map[time.Duration]time.Duration{delivery[0]: berth[0], delivery[1]: berth[1]}
	if got[400*time.Microsecond] != 600*time.Microsecond || got[300*time.Microsecond] != 0 {
		t.Errorf("delivery → Berth's share: %v; want 0.4 ms → 0.6 ms and 0.3 ms → 0", got)
	}
}
