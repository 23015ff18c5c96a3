package events

import (
	"sort"
	"strings"
)

// NormalizeLabels lower-cases, trims, deduplicates and sorts labels. GitHub
// compares runner labels case-insensitively.
func NormalizeLabels(labels []string) []string {
	seen := make(map[string]struct{}, len(labels))
	out := make([]string, 0, len(labels))
	for _, l := range labels {
		l = strings.ToLower(strings.TrimSpace(l))
		if l == "" {
			continue
		}
		if _, dup := seen[l]; dup {
			continue
		}
		seen[l] = struct{}{}
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// LabelKey is a canonical string for a label set, for counting demand per set.
func LabelKey(labels []string) string { return strings.Join(NormalizeLabels(labels), ",") }

// Serves reports whether a runner with runnerLabels can take a job asking for
// jobLabels: GitHub assigns a job to a self-hosted runner that has every label
// the job's runs-on names (case-insensitive). An empty job label set matches
// nothing: such a job is not for self-hosted runners.
func Serves(runnerLabels, jobLabels []string) bool {
	job := NormalizeLabels(jobLabels)
	if len(job) == 0 {
		return false
	}
	have := make(map[string]struct{}, len(runnerLabels))
	for _, l := range runnerLabels {
		have[strings.ToLower(strings.TrimSpace(l))] = struct{}{}
	}
	for _, l := range job {
		if _, ok := have[l]; !ok {
			return false
		}
	}
	return true
}

// MatchPool picks the pool that serves a job: among pools whose labels
// include all of the job's labels, the one with the fewest labels (the most
// specific fit), ties broken by name, so the choice is deterministic. It
// returns "" when no pool serves the job.
func MatchPool(jobLabels []string, pools map[string][]string) string {
	best, bestN := "", 0
	for name, labels := range pools {
		if !Serves(labels, jobLabels) {
			continue
		}
		n := len(NormalizeLabels(labels))
		if best == "" || n < bestN || (n == bestN && name < best) {
			best, bestN = name, n
		}
	}
	return best
}

// Matcher answers MatchPool for many jobs against one set of pools without
// re-normalising the pools' labels for every job: build it once per
// decision. Its answers equal MatchPool's.
type Matcher struct {
	pools []matcherPool
	cache map[string]string // job label key → pool
}

type matcherPool struct {
	name, installation string
	labels             map[string]struct{}
}

// NewMatcher prepares pools (name → runner labels) for matching, every
// pool serving the unnamed installation.
func NewMatcher(pools map[string][]string) *Matcher { return NewMatcherIn(pools, nil) }

// NewMatcherIn is NewMatcher where installs names the GitHub installation
// of a pool (absent: the unnamed one): a job is matched only among the
// pools of its own installation (Job.Installation), so two installations
// may give pools the same labels.
func NewMatcherIn(pools map[string][]string, installs map[string]string) *Matcher {
	m := &Matcher{cache: map[string]string{}}
	for name, labels := range pools {
		set := map[string]struct{}{}
		for _, l := range NormalizeLabels(labels) {
			set[l] = struct{}{}
		}
		m.pools = append(m.pools, matcherPool{name, installs[name], set})
	}
	// Most specific first, then by name: the first pool that serves wins.
	sort.Slice(m.pools, func(i, j int) bool {
		if len(m.pools[i].labels) != len(m.pools[j].labels) {
			return len(m.pools[i].labels) < len(m.pools[j].labels)
		}
		return m.pools[i].name < m.pools[j].name
	})
	return m
}

// Match returns the pool of the unnamed installation that serves
// jobLabels, or "".
func (m *Matcher) Match(jobLabels []string) string {
	job := NormalizeLabels(jobLabels)
	return m.match("", strings.Join(job, ","), job)
}

// MatchJob is Match for a folded job, whose labels are normalised already:
// after the first job of a label set it costs one map lookup, no
// allocation (Decide matches every queued job on every round).
// A job of a named installation is matched among that installation's
// pools only (its cache key allocates once per lookup).
func (m *Matcher) MatchJob(j *Job) string { return m.match(j.Installation, j.LabelKey(), j.Labels) }

func (m *Matcher) match(installation, key string, job []string) string {
	if installation != "" {
		key = installation + "\x00" + key
	}
	if pool, ok := m.cache[key]; ok {
		return pool
	}
	pool := ""
	if len(job) > 0 {
	next:
		for _, p := range m.pools {
			if p.installation != installation {
				continue
			}
			for _, l := range job {
				if _, ok := p.labels[l]; !ok {
					continue next
				}
			}
			pool = p.name
			break
		}
	}
	m.cache[key] = pool
	return pool
}
