package events

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"

	fastjson "github.com/segmentio/encoding/json"
	"strings"
	"time"
)

// SnapshotVersion is the shape of MarshalSnapshot's output. A reader that
// meets another version ignores the snapshot and replays the whole log.
// 2: hosts count their booked VMs per pool (Host.BookedIn, machine
// shapes), and settled jobs and attempts are kept as packed ids, which a
// version 1 snapshot lacks.
// 3: hosts keep their claim and their grant apart (HostGranted).
const SnapshotVersion = 3

// Snapshot shapes: the fold's state, unexported fields included, with every
// collection sorted so equal folds give equal bytes.
type (
	snapStamp struct {
		At  time.Time `json:"at"`
		Seq uint64    `json:"seq"`
		ID  string    `json:"id"`
	}
	snapAttempt struct {
		*Attempt
		ReleaseKeys []string `json:"release_keys,omitempty"`
	}
	snapHost struct {
		*Host
		Online snapStamp `json:"online_stamp"`
		State  snapStamp `json:"state_stamp"`
		Cordon snapStamp `json:"cordon_stamp"`
		Grant  snapStamp `json:"grant_stamp"`
	}
	snapAlarm struct {
		*Alarm
		Last snapStamp `json:"last_stamp"`
	}
	snapRepo struct {
		Installation string `json:"installation,omitempty"`
		Org          string `json:"org"`
		Repo         string `json:"repo"`
		At           int64  `json:"at"`
	}
	snapshot struct {
		Version        int                  `json:"version"`
		LastSeq        uint64               `json:"last_seq"`
		Skipped        int                  `json:"skipped"`
		Applied        int                  `json:"applied"`
		Jobs           []*Job               `json:"jobs,omitempty"`
		Attempts       []snapAttempt        `json:"attempts,omitempty"`
		Hosts          []snapHost           `json:"hosts"`
		Pools          []*Pool              `json:"pools"`
		Alarms         []snapAlarm          `json:"alarms"`
		DemandReported map[string]time.Time `json:"demand_reported"`
		ByRunner       map[string]int64     `json:"by_runner,omitempty"`
		Deliveries     map[string]time.Time `json:"deliveries,omitempty"`
		GitHub         GitHubHealth         `json:"github"`
		// What is left of jobs and attempts that are over (version 2):
		// each hour's ids packed (idset.go).
		SettledJobHours       []snapHour    `json:"settled_job_hours,omitempty"`
		SettledPlacementHours []snapHour    `json:"settled_placement_hours,omitempty"`
		SettledDeliveryHours  []snapHour    `json:"settled_delivery_hours,omitempty"`
		SettledAttempts       tombs[string] `json:"settled_attempts,omitempty"`
		SawJobs               bool          `json:"saw_jobs,omitempty"`
		Repos                 []snapRepo    `json:"repos,omitempty"`
		// The same as earlier builds wrote it, read so that their
		// snapshots still load: an id and its time each; deliveries 24
		// bytes each (unmarshalDeliveries).
		SettledJobs       tombs[int64]  `json:"settled_jobs,omitempty"`
		SettledPlaced     tombs[uint64] `json:"settled_placements,omitempty"`
		SettledDeliveries []byte        `json:"settled_deliveries,omitempty"`
	}
)

func toSnap(s stamp) snapStamp   { return snapStamp{s.at, s.seq, s.id} }
func fromSnap(s snapStamp) stamp { return stamp{s.At, s.Seq, s.ID} }

// MarshalSnapshot encodes the whole projection, as of f.LastSeq, so that a
// service can restart from it and fold only the tail of the log (law 9: a
// snapshot is only a shortcut; a property test proves snapshot + tail equals
// a full replay).
func MarshalSnapshot(f *Fleet) ([]byte, error) {
	z, err := FreezeSnapshot(f)
	if err != nil {
		return nil, err
	}
	return z.Marshal()
}

// Frozen is a fold's state as of one sequence, copied so that the fold may
// go on applying facts while it is encoded elsewhere (FreezeSnapshot).
type Frozen struct {
	s                frozenSnapshot
	jobs, placements hourly[uint64, packed]
	deliveries       hourly[uuidID, uuids]
}

// frozenSnapshot is snapshot with its hosts already encoded: the outer
// field wins over the embedded one of the same name (encoding/json's rule,
// which segmentio's encoder keeps).
type frozenSnapshot struct {
	snapshot
	Hosts fastjson.RawMessage `json:"hosts"`
}

// FreezeSnapshot copies what MarshalSnapshot encodes, in O(the fold's
// records), so that a service's loop is held for a copy and not for the
// encoding (a dispatcher's fold of 10,000 running jobs took over a second
// to encode, and every job placed meanwhile waited). It copies each job's
// and attempt's struct and the maps of the fold; the slices a record holds
// are shared, which is safe because Apply only ever assigns new ones. The
// hosts, whose maps and pointers nest, are few: they are encoded here.
func FreezeSnapshot(f *Fleet) (*Frozen, error) {
	z := &Frozen{jobs: f.history.jobs, placements: f.history.placements, deliveries: f.history.deliveries}
	z.jobs.gens = slices.Clone(z.jobs.gens) // each generation's set is never changed, only replaced
	z.placements.gens = slices.Clone(z.placements.gens)
	z.deliveries.gens = slices.Clone(z.deliveries.gens)
	s := snapshot{Version: SnapshotVersion, LastSeq: f.LastSeq, Skipped: f.Skipped, Applied: f.Applied,
		DemandReported: maps.Clone(f.DemandReported), ByRunner: maps.Clone(f.byRunner), Deliveries: maps.Clone(f.Deliveries), GitHub: f.GitHub,
		SettledAttempts: slices.Clone(f.history.attempts), SawJobs: f.sawJobs}
	for k, at := range f.history.repos {
		s.Repos = append(s.Repos, snapRepo{k.installation, k.org, k.repo, at})
	}
	// The copies go into one array each, not one allocation each: 20,000
	// fewer allocations for a fold of 10,000 running jobs. The copy still
	// holds the loop 14–15 ms at that size on 500 hosts
	// (BenchmarkFreezeSnapshot): moving the records' bytes, and encoding
	// the hosts.
	jobs := make([]Job, len(f.Jobs))
	s.Jobs = make([]*Job, 0, len(f.Jobs))
	for _, j := range f.Jobs {
		c := &jobs[len(s.Jobs)]
		*c = *j
		s.Jobs = append(s.Jobs, c)
	}
	attempts := make([]Attempt, len(f.Attempts))
	s.Attempts = make([]snapAttempt, 0, len(f.Attempts))
	for _, a := range f.Attempts {
		c := &attempts[len(s.Attempts)]
		*c = *a
		c.releases = nil
		sa := snapAttempt{Attempt: c}
		for k := range a.releases {
			sa.ReleaseKeys = append(sa.ReleaseKeys, k)
		}
		s.Attempts = append(s.Attempts, sa)
	}
	var hosts []snapHost
	for _, h := range f.Hosts {
		hosts = append(hosts, snapHost{Host: h, Online: toSnap(h.online), State: toSnap(h.state), Cordon: toSnap(h.cordon), Grant: toSnap(h.grant)})
	}
	sort.Slice(hosts, func(a, b int) bool { return hosts[a].Name < hosts[b].Name })
	hb, err := fastjson.Marshal(hosts)
	if err != nil {
		return nil, err
	}
	for _, p := range f.Pools {
		c := *p
		s.Pools = append(s.Pools, &c)
	}
	for _, al := range f.Alarms {
		c := *al
		s.Alarms = append(s.Alarms, snapAlarm{Alarm: &c, Last: toSnap(al.last)})
	}
	z.s = frozenSnapshot{snapshot: s, Hosts: hb}
	return z, nil
}

// Marshal encodes the frozen state (Encode's bytes); it may run on any
// goroutine, once.
func (z *Frozen) Marshal() ([]byte, error) {
	var b bytes.Buffer
	if err := z.Encode(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Encode writes the frozen state to w as JSON, one job or attempt at a
// time, so that encoding a fold of 10,000 running jobs (tens of
// megabytes) into a compressor never holds the whole text: encoded in
// one piece it took a buffer grown by doubling, then a copy, about 80 MB
// a snapshot in the scale bench's heap. It may run on any goroutine,
// once. The jobs and the attempts come first; a reader does not care
// about the order of fields, and equal folds still give equal bytes.
func (z *Frozen) Encode(w io.Writer) error {
	s := &z.s.snapshot
	s.SettledJobHours, s.SettledPlacementHours = marshalPackedHours(z.jobs), marshalPackedHours(z.placements)
	s.SettledDeliveryHours = marshalUUIDHours(z.deliveries)
	sort.Slice(s.Repos, func(a, b int) bool {
		ra, rb := s.Repos[a], s.Repos[b]
		return ra.Installation+"/"+ra.Org+"/"+ra.Repo < rb.Installation+"/"+rb.Org+"/"+rb.Repo
	})
	sort.Slice(s.Jobs, func(a, b int) bool { return s.Jobs[a].ID < s.Jobs[b].ID })
	for _, sa := range s.Attempts {
		sort.Strings(sa.ReleaseKeys)
	}
	sort.Slice(s.Attempts, func(a, b int) bool { return s.Attempts[a].ID < s.Attempts[b].ID })
	sort.Slice(s.Pools, func(a, b int) bool { return s.Pools[a].Name < s.Pools[b].Name })
	sort.Slice(s.Alarms, func(a, b int) bool { return s.Alarms[a].Key < s.Alarms[b].Key })
	// What grows with the jobs is written a record at a time; the rest
	// (hosts, pools, alarms, the packed ids of settled jobs) in one piece.
	jobs, attempts, byRunner, deliveries := s.Jobs, s.Attempts, s.ByRunner, s.Deliveries
	s.Jobs, s.Attempts, s.ByRunner, s.Deliveries = nil, nil, nil, nil // omitted from the rest
	defer func() { s.Jobs, s.Attempts, s.ByRunner, s.Deliveries = jobs, attempts, byRunner, deliveries }()
	p := pieces{w: w, buf: make([]byte, 0, 64<<10)}
	p.list(`{"jobs":[`, len(jobs), func(i int) any { return jobs[i] })
	p.list(`,"attempts":[`, len(attempts), func(i int) any { return attempts[i] })
	pieceMap(&p, `,"by_runner":{`, byRunner)
	if len(deliveries) > 0 {
		pieceMap(&p, `,"deliveries":{`, deliveries)
	}
	if p.err == nil {
		// The rest is one object, "{...}": its fields go on inside this one.
		at := len(p.buf)
		p.buf, p.err = fastjson.Append(p.buf, z.s, pieceFlags)
		switch {
		case p.err != nil:
		case len(p.buf) > at+2:
			p.buf[at] = ','
		default: // "{}": nothing else to write
			p.buf = append(p.buf[:at], '}')
		}
	}
	p.flush()
	return p.err
}

// pieces writes JSON to w through a buffer it empties every 32 KiB, with
// segmentio's encoder (the decoder's pair, UnmarshalSnapshot) and the
// flags of its Marshal; the first error sticks.
type pieces struct {
	w   io.Writer
	buf []byte
	err error
}

const pieceFlags = fastjson.EscapeHTML | fastjson.SortMapKeys

func (p *pieces) raw(s string) { p.buf = append(p.buf, s...) }

func (p *pieces) value(v any) {
	if p.err == nil {
		p.buf, p.err = fastjson.Append(p.buf, v, pieceFlags)
	}
	if len(p.buf) >= 32<<10 {
		p.flush()
	}
}

func (p *pieces) flush() {
	if p.err == nil && len(p.buf) > 0 {
		_, p.err = p.w.Write(p.buf)
	}
	p.buf = p.buf[:0]
}

// list writes n items as a JSON array after open (which ends in "[").
func (p *pieces) list(open string, n int, item func(i int) any) {
	p.raw(open)
	for i := range n {
		if i > 0 {
			p.raw(",")
		}
		p.value(item(i))
	}
	p.raw("]")
}

// pieceMap writes m as a JSON object after open (which ends in "{"), its
// keys sorted as Marshal sorts them.
func pieceMap[V any](p *pieces, open string, m map[string]V) {
	p.raw(open)
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			p.raw(",")
		}
		p.value(k)
		p.raw(":")
		p.value(m[k])
	}
	p.raw("}")
}

// UnmarshalSnapshot rebuilds a projection from MarshalSnapshot's bytes. It
// returns an error for bytes of another version or shape: the caller then
// replays the whole log.
func UnmarshalSnapshot(b []byte) (*Fleet, error) {
	var s snapshot
	// segmentio's decoder, as for events (envelope.go): a restart is
	// mostly decoding this, and a fold of 100,000 retained jobs is 170 MiB.
	if err := fastjson.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if s.Version != SnapshotVersion {
		return nil, fmt.Errorf("snapshot version %d, this build reads %d", s.Version, SnapshotVersion)
	}
	f := NewFleet()
	f.LastSeq, f.Skipped, f.Applied, f.GitHub = s.LastSeq, s.Skipped, s.Applied, s.GitHub
	if err := s.restoreHistory(f); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	f.sawJobs = s.SawJobs
	for _, r := range s.Repos {
		if f.history.repos == nil {
			f.history.repos = map[repoKey]int64{}
		}
		f.history.repos[repoKey{r.Installation, r.Org, r.Repo}] = r.At
	}
	for _, j := range s.Jobs {
		j.labelKey = strings.Join(j.Labels, ",")
		f.Jobs[j.ID] = j
	}
	for _, sa := range s.Attempts {
		a := sa.Attempt
		if len(sa.ReleaseKeys) > 0 {
			a.releases = map[string]struct{}{}
			for _, k := range sa.ReleaseKeys {
				a.releases[k] = struct{}{}
			}
		}
		f.Attempts[a.ID] = a
	}
	for _, sh := range s.Hosts {
		h := sh.Host
		h.online, h.state, h.cordon, h.grant = fromSnap(sh.Online), fromSnap(sh.State), fromSnap(sh.Cordon), fromSnap(sh.Grant)
		if h.Pools == nil {
			h.Pools = map[string]PoolSlots{}
		}
		if h.Held == nil {
			h.Held = map[string]int{}
		}
		if h.BookedIn == nil {
			h.BookedIn = map[string]int{}
		}
		f.Hosts[h.Name] = h
	}
	for _, p := range s.Pools {
		f.Pools[p.Name] = p
	}
	for _, sa := range s.Alarms {
		a := sa.Alarm
		a.last = fromSnap(sa.Last)
		f.Alarms[a.Key] = a
	}
	if s.DemandReported != nil {
		f.DemandReported = s.DemandReported
	}
	if s.ByRunner != nil {
		f.byRunner = s.ByRunner
	}
	if s.Deliveries != nil {
		f.Deliveries = s.Deliveries
	}
	return f, nil
}

// restoreHistory puts the settled ids into f: packed by the hour, and
// those an earlier build wrote one by one.
func (s *snapshot) restoreHistory(f *Fleet) error {
	var err error
	h := &f.history
	h.attempts = s.SettledAttempts
	if h.jobs, err = unmarshalPackedHours(0, s.SettledJobHours); err != nil {
		return err
	}
	if h.placements, err = unmarshalPackedHours(attemptLow, s.SettledPlacementHours); err != nil {
		return err
	}
	if h.deliveries, err = unmarshalUUIDHours(s.SettledDeliveryHours); err != nil {
		return err
	}
	jobs := make([]stamped[uint64], 0, len(s.SettledJobs))
	for _, t := range s.SettledJobs {
		jobs = append(jobs, stamped[uint64]{jobKey(t.ID), t.At})
	}
	h.jobs.add(jobs)
	placed := make([]stamped[uint64], 0, len(s.SettledPlaced))
	for _, t := range s.SettledPlaced {
		placed = append(placed, stamped[uint64]{t.ID, t.At})
	}
	h.placements.add(placed)
	d, err := unmarshalDeliveries(s.SettledDeliveries)
	h.deliveries.add(d)
	return err
}
