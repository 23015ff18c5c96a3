package watchdog_test

import (
	"testing"

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
