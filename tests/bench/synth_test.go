package bench

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Given a fact of every type in the catalogue, stored as the services store
// them, when the bench's followers read its type without decoding it, then
// they read the envelope's type: the stored facts carry no type header
// since 2026-12-07, and the counters the phases wait on would otherwise
// count nothing, and wait out their deadlines.
func TestFactTypeReadsTheEnvelopesTypeOfEveryFact(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	for typ, p := range events.Types() {
		body, err := events.Marshal(events.New(`berth/"type":"forged"`, at, p))
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if got := FactType(body); got != typ {
			t.Errorf("FactType of a %s fact = %q", typ, got)
		}
	}
	for _, body := range []string{"", "{}", `{"type":"berth.job.queued.v1`, "not json"} {
		if got := FactType([]byte(body)); got != "" {
			t.Errorf("FactType(%q) = %q, want none", body, got)
		}
	}
}
