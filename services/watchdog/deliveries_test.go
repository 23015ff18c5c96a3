package watchdog_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/watchdog"
)

// Given a watchdog, then its fold keeps no GitHub delivery ids: only the
// dispatcher asks GitHub to redeliver, and each id costs 16 bytes for three
// days (issue 19).
func TestTheWatchdogsFoldKeepsNoDeliveryIDs(t *testing.T) {
	w := watchdog.New(nil, nil, watchdog.Params{}, nil, nil)
	if w.Fold.KeepsDeliveryIDs() {
		t.Fatal("the watchdog's fold keeps delivery ids")
	}
}

// Given a watchdog, when its fold folds a placement carrying a sealed JIT
// config, then the attempt is placed and the config is not kept: only the
// agent creating the VM opens it (its size again for each running job).
func TestTheWatchdogsFoldKeepsNoSealedJITConfig(t *testing.T) {
	w := watchdog.New(nil, nil, watchdog.Params{}, nil, nil)
	ref := events.AttemptRef{Attempt: "a-7-1", Pool: "linux", Host: "host-a"}
	e := events.New("test", time.Now(), &events.AttemptPlaced{AttemptRef: ref, JobID: 7, RunnerID: 70,
		SealedJIT: []byte("SEALED"), SealedBy: "XD", SealedTo: "Xhost-a"})
	e.Seq = 1
	w.Fold.Apply(e)
	a := w.Fold.Attempts[ref.Attempt]
	if a == nil || !a.Placed || a.SealedJIT != nil || a.SealedBy != "" || a.SealedTo != "" {
		t.Fatalf("attempt in the watchdog's fold: %+v, want placed without its sealed config", a)
	}
}
