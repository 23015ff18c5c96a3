package watchdog

import (
	"context"

	"github.com/berth-ci/berth/events"
)

// HeardRevision is the heartbeat bucket revision the watchdog last saw
// for host (0: none), so a test moves the clock only once it was seen.
func HeardRevision(w *Watchdog, host string) uint64 {
	w.hbMu.Lock()
	defer w.hbMu.Unlock()
	return w.beats[host].rev
}

// MarkedEnd is where the log ended when the watchdog last read it for a
// judgment it held (0: never read), read on the loop.
func MarkedEnd(ctx context.Context, w *Watchdog) (uint64, error) {
	var end uint64
	err := w.Read(ctx, func(*events.Fleet) { end = w.mark.end })
	return end, err
}
