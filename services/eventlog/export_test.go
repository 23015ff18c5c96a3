package eventlog

import "context"

// SetSource makes l deliver from fn in place of a consumer: a test's
// consumer, which may lie (a pending count of 0 before the end).
func SetSource(l *Loop, fn func(ctx context.Context, from uint64, ch chan<- Delivered) error) {
	l.source = fn
}
