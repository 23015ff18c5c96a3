package dispatch

import "github.com/berth-ci/berth/events"

// Machine shapes (issue 20, events/shape.go): each named shape of a pool is
// advertised as a pool of its own, so matching and booking need nothing
// new; placement counts the shapes' resources, and a job naming a shape no
// pool offers is given up on with the reason, never served by a default.

// fitsShape reports whether one more VM of pool fits host h's resources,
// counting what this round booked there already (heldNow: host, pool →
// slots).
func fitsShape(h *events.Host, pool string, heldNow map[[2]string]int) bool {
	return events.HostFits(h, pool, func(p string) int { return heldNow[[2]string{h.Name, p}] })
}

// unknownShape is the JobUnschedulable for a job whose shape labels no
// advertised pool offers while some pool serves its other labels.
func unknownShape(j *events.Job, pools map[string][]string) (events.JobUnschedulable, bool) {
	named := false
	for _, l := range j.Labels {
		named = named || events.IsShapeLabel(l)
	}
	if !named { // most jobs: no work for them each round
		return events.JobUnschedulable{}, false
	}
	reason, ok := events.UnknownShape(j.Labels, pools)
	if !ok {
		return events.JobUnschedulable{}, false
	}
	return events.JobUnschedulable{JobID: j.ID, Reason: reason}, true
}
