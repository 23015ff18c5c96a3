package setintake

import (
	"sync"
	"sync/atomic"
)

// Metrics counts what the intake did; read with Snapshot.
type Metrics struct {
	Sessions, Messages, Facts, Skipped, Reconciled atomic.Int64

	mu       sync.Mutex
	capacity map[string]int
}

func (m *Metrics) add(c *atomic.Int64, n int) { c.Add(int64(n)) }

func (m *Metrics) setCapacity(pool string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.capacity == nil {
		m.capacity = map[string]int{}
	}
	m.capacity[pool] = n
}

// Capacity is the last X-ScaleSetMaxCapacity the pool's set polled with.
func (m *Metrics) Capacity(pool string) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.capacity[pool]
	return n, ok
}
