package events_test

import (
	"reflect"
	"testing"
)

// Given a fleet with held slots, queued jobs and finished ones, when its
// status is read as counts alone, then every figure is the whole status's
// and only the list of held slots is left empty.
func TestStatusCountsIsTheStatusWithoutTheHeldSlots(t *testing.T) {
	f := benchFleet(1000)
	whole, counts := f.Status(), f.StatusCounts()
	held := 0
	for i := range whole.Pools {
		held += len(whole.Pools[i].HeldBy)
		if n := len(counts.Pools[i].HeldBy); n != 0 {
			t.Fatalf("pool %s: %d held slots listed in the counts, want none", counts.Pools[i].Name, n)
		}
		whole.Pools[i].HeldBy = counts.Pools[i].HeldBy
	}
	if held == 0 {
		t.Fatal("the fleet holds no slot: the test shows nothing")
	}
	if !reflect.DeepEqual(whole, counts) {
		t.Fatalf("counts differ from the status beyond HeldBy:\nstatus %+v\ncounts %+v", whole, counts)
	}
}
