package eventlog

import (
	"context"
	"time"
)

// SetSource makes l deliver from fn in place of a consumer: a test's
// consumer, which may lie (a pending count of 0 before the end).
func SetSource(l *Loop, fn func(ctx context.Context, from uint64, ch chan<- Delivered) error) {
	l.source = fn
}

// SetInUseLooks shortens how long a first create watches a consumer of its
// name for another reader (n looks, every apart); it returns the restore.
func SetInUseLooks(n int, every time.Duration) func() {
	n0, e0 := inUseLooks, inUseEvery
	inUseLooks, inUseEvery = n, every
	return func() { inUseLooks, inUseEvery = n0, e0 }
}
