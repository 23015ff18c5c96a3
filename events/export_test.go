package events

// ScanPoolLabels is PoolLabels from a walk over every host, as it was
// computed before the fold kept it: what the kept labels must equal.
func (f *Fleet) ScanPoolLabels() map[string][]string { l, _ := f.scanPoolLabels(); return l }
