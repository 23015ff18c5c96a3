package page

import (
	"fmt"
	"strings"
	"time"
)

// The pictures are inline SVG drawn here, on the server: nothing to fetch,
// nothing to run in the browser. Sizes are in SVG user units.
const (
	chartW, chartH = 320, 90
	barW           = 36
)

// Lines is the held-and-demand picture of one pool over the last Window:
// polyline points (x,y pairs) for held slots and demand, the capacity's y,
// and the y axis' top value.
type Lines struct {
	W, H         int
	Held, Demand string
	CapacityY    int
	Top          int
	Span         string // how far back the picture reaches, e.g. "last 60m"
}

// lines draws samples (oldest first) plus the current value at now as
// steps: a value holds until the next sample.
func lines(samples []Sample, capacity int, now time.Time) Lines {
	top := capacity
	for _, s := range samples {
		top = max(top, s.Held, s.Demand)
	}
	top = max(top, 1)
	// The picture spans what was sampled, up to Window and at least half
	// a minute, so a young dispatcher's minutes fill the width.
	from := now.Add(-Window)
	if len(samples) > 0 && samples[0].At.After(from) {
		from = samples[0].At
	}
	if now.Sub(from) < 30*time.Second {
		from = now.Add(-30 * time.Second)
	}
	span := now.Sub(from)
	x := func(t time.Time) int {
		if t.Before(from) {
			t = from
		}
		return int(float64(chartW) * float64(t.Sub(from)) / float64(span))
	}
	y := func(v int) int { return chartH - chartH*v/top }
	held := steps(samples, x, func(s Sample) int { return y(s.Held) })
	demand := steps(samples, x, func(s Sample) int { return y(s.Demand) })
	return Lines{W: chartW, H: chartH, Held: held, Demand: demand, CapacityY: y(capacity), Top: top,
		Span: "last " + span.Round(time.Second).String()}
}

// steps is the polyline of one series as steps: a value holds until the
// next sample, and the last one until the right edge.
func steps(samples []Sample, x func(time.Time) int, y func(Sample) int) string {
	var b strings.Builder
	for i, s := range samples {
		if i > 0 {
			fmt.Fprintf(&b, "%d,%d ", x(s.At), y(samples[i-1]))
		}
		fmt.Fprintf(&b, "%d,%d ", x(s.At), y(s))
	}
	if n := len(samples); n > 0 {
		fmt.Fprintf(&b, "%d,%d", chartW, y(samples[n-1]))
	}
	return b.String()
}

// Bar is one bar of the queue time histogram.
type Bar struct {
	X, Y, W, H int
	Label      string
	Jobs       int
}

// Bars is the queue time picture: one bar per bucket.
type Bars struct {
	W, H  int
	Bars  []Bar
	Total int
}

func bars(h []Bucket) Bars {
	top := 1
	total := 0
	for _, b := range h {
		top = max(top, b.Jobs)
		total += b.Jobs
	}
	out := Bars{W: barW * len(h), H: chartH, Total: total}
	const labelH = 14
	for i, b := range h {
		hh := (chartH - labelH - 10) * b.Jobs / top // 10: room for the count above the tallest bar
		out.Bars = append(out.Bars, Bar{X: i*barW + 2, Y: chartH - labelH - hh, W: barW - 4, H: hh, Label: b.Label, Jobs: b.Jobs})
	}
	return out
}
