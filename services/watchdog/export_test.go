package watchdog

// HeardRevision is the heartbeat bucket revision the watchdog last saw
// for host (0: none), so a test moves the clock only once it was seen.
func HeardRevision(w *Watchdog, host string) uint64 {
	w.hbMu.Lock()
	defer w.hbMu.Unlock()
	return w.beats[host].rev
}
