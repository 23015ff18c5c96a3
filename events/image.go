package events

import "slices"

// Runner-version health (issue 20): GitHub refuses runners whose version it
// no longer accepts (since 2026-09-25 every release older than 30 days for
// jobs; older than 2.329.0 for registration). Such a runner starts, exits
// without taking a job, and a fresh VM of the same image would do the same:
// so a refusal marks the image degraded on its host, not the job and not
// the host. Placement stops booking that image there (one probe at a time
// after a back-off), the job keeps its attempts and waits as demand, and
// the watchdog raises an alarm naming the image and the minimum version.

// AttemptRunnerVersion: the attempt's runner printed its version
// (actions/runner's "Current runner version: 'X'"), booting Image. Subject:
// the attempt's, written by its host's agent (law 10: a host speaks for its
// own attempts). Nobody acts on it but the fold: it is what each image
// starts, for status and for the alarm. Key: attempt + "/runner_version".
type AttemptRunnerVersion struct {
	AttemptRef
	// Image is the image the attempt booted (ImageOf its pool's shape).
	Image   string `json:"image"`
	Version string `json:"version"`
}

func (AttemptRunnerVersion) EventType() string { return TypeAttemptRunnerVersion }
func (e AttemptRunnerVersion) EventID() string { return e.Attempt + "/runner_version" }

// AttemptRunnerRefused: GitHub refused the attempt's runner for its version
// (it printed GitHub's refusal and exits without taking a job). Subject:
// the attempt's, written by its host's agent. The dispatcher releases the
// slot charged to the image (ReleaseRunnerRefused: the job's attempts are
// not spent, it stays demand) and books the image on that host only as a
// probe after a back-off; the watchdog raises AlarmImageDegraded. Key:
// attempt + "/runner_refused".
type AttemptRunnerRefused struct {
	AttemptRef
	Image   string `json:"image"`
	Version string `json:"version,omitempty"`
	// Minimum is the least version GitHub said it accepts, when its
	// message names one ("" when it does not: the deprecation message
	// names only the refused version).
	Minimum string `json:"minimum,omitempty"`
	// Message is GitHub's refusal as the runner printed it.
	Message string `json:"message"`
}

func (AttemptRunnerRefused) EventType() string { return TypeAttemptRunnerRefused }
func (e AttemptRunnerRefused) EventID() string { return e.Attempt + "/runner_refused" }

// ReleaseRunnerRefused: GitHub refused the attempt's runner for its version;
// charged to the image, never to the job.
const ReleaseRunnerRefused = "runner_refused"

// AlarmImageDegraded: GitHub refuses the runners an image starts on a host;
// jobs of the pools booting it there wait as demand.
const AlarmImageDegraded = "image_degraded"

// ImageOf is the name of the image an attempt of pool boots on a host whose
// pool declares shape: the shape's image, or "default/<pool>" for the
// backend's own (a host's default image is known to its agent alone).
func ImageOf(pool string, shape *Shape) string {
	if shape != nil && shape.Image != "" {
		return shape.Image
	}
	return "default/" + pool
}

// imageMemory is how many of an image's latest refusals a host keeps: enough
// for the probe back-off to reach its ceiling.
const imageMemory = 8

// ImageHealth is what the log says about the runners one image starts on
// one host (Host.Images). Marks order by the log (law 10).
type ImageHealth struct {
	Name string `json:"name"`
	// Version is the runner version reported last (display).
	Version string `json:"version,omitempty"`
	// Refused holds the newest refusals (at most imageMemory), oldest first;
	// RefusedVersion, Minimum and Message are the newest refusal's.
	Refused        []Mark `json:"refused,omitempty"`
	RefusedVersion string `json:"refused_version,omitempty"`
	Minimum        string `json:"minimum,omitempty"`
	Message        string `json:"message,omitempty"`
	// Accepted is the newest proof the image works again: a runner of it
	// took a job, or reported a version other than the one refused.
	Accepted Mark `json:"accepted"`
}

// LastRefused is the newest refusal (zero: none).
func (i *ImageHealth) LastRefused() Mark {
	if i == nil || len(i.Refused) == 0 {
		return Mark{}
	}
	return i.Refused[len(i.Refused)-1]
}

// Degraded reports whether GitHub's last word on the image's runners was a
// refusal: no proof it works came after it.
func (i *ImageHealth) Degraded() bool {
	last := i.LastRefused()
	return last != (Mark{}) && last.After(i.Accepted)
}

// RefusalsSinceAccepted counts the remembered refusals after the last
// proof the image works: the probe back-off doubles with each.
func (i *ImageHealth) RefusalsSinceAccepted() int {
	n := 0
	for _, m := range i.Refused {
		if m.After(i.Accepted) {
			n++
		}
	}
	return n
}

// ImageDegraded returns the health of the image pool boots on h when it is
// degraded, else nil.
func (h *Host) ImageDegraded(pool string) *ImageHealth {
	ps, ok := h.Pools[pool]
	if !ok {
		return nil
	}
	if i := h.Images[ImageOf(pool, ps.Shape)]; i != nil && i.Degraded() {
		return i
	}
	return nil
}

func (f *Fleet) image(host, name string) *ImageHealth {
	h := f.host(host)
	if h.Images == nil {
		h.Images = map[string]*ImageHealth{}
	}
	i := h.Images[name]
	if i == nil {
		i = &ImageHealth{Name: name}
		h.Images[name] = i
	}
	return i
}

// runnerVersion folds a version report: on the attempt, and on its image,
// where a version other than the one refused proves the image was replaced.
func (f *Fleet) runnerVersion(d *AttemptRunnerVersion, e Event) {
	f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) { a.Image, a.RunnerVersion = d.Image, d.Version })
	i := f.image(d.Host, d.Image)
	i.Version = d.Version
	if m := markOf(e); i.RefusedVersion != "" && d.Version != i.RefusedVersion && m.After(i.LastRefused()) {
		i.Accepted = maxMark(i.Accepted, m)
	}
}

// runnerRefused folds a refusal onto the attempt and its image.
func (f *Fleet) runnerRefused(d *AttemptRunnerRefused, e Event) {
	f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) { a.Image, a.RunnerRefused = d.Image, true })
	i := f.image(d.Host, d.Image)
	m := markOf(e)
	if slices.Contains(i.Refused, m) {
		return
	}
	if !m.Before(i.LastRefused()) {
		i.RefusedVersion, i.Minimum, i.Message = d.Version, d.Minimum, d.Message
	}
	i.Refused = append(i.Refused, m)
	slices.SortFunc(i.Refused, func(a, b Mark) int {
		switch {
		case a.After(b):
			return 1
		case b.After(a):
			return -1
		}
		return 0
	})
	if n := len(i.Refused); n > imageMemory {
		i.Refused = slices.Delete(i.Refused, 0, n-imageMemory)
	}
}

// imageRanJob records that a runner of the attempt's image took a job: the
// image works on that host.
func (f *Fleet) imageRanJob(r AttemptRef, e Event) {
	h := f.Hosts[r.Host]
	if h == nil {
		return
	}
	name := ImageOf(r.Pool, h.Pools[r.Pool].Shape)
	if a := f.Attempts[r.Attempt]; a != nil && a.Image != "" {
		name = a.Image
	}
	if i := h.Images[name]; i != nil {
		i.Accepted = maxMark(i.Accepted, markOf(e))
	}
}

// Before reports whether m was stored before o.
func (m Mark) Before(o Mark) bool { return o.After(m) }
