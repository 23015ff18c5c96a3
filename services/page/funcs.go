package page

import (
	"html/template"
	"strings"
	"time"
)

// funcs are the templates' helpers: formatting only, no reads.
func funcs(script template.JS) template.FuncMap {
	return template.FuncMap{
		"script": func() template.JS { return script },
		"ago":    ago,
		"dur":    dur,
		"join":   func(s []string) string { return strings.Join(s, ", ") },
		"lines":  func(c PoolChart, now time.Time) Lines { return lines(c.Samples, c.Capacity, now) },
		"bars":   bars,
		"add":    func(a, b int) int { return a + b },
		"jobs": func(title string, rows []JobRow, now time.Time) jobTable {
			return jobTable{Title: title, Rows: rows, Now: now}
		},
		"clock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
		"stamp": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 UTC") },
		"hb": func(now time.Time, t *time.Time) string {
			if t == nil {
				return "never"
			}
			return ago(now, *t)
		},
	}
}

// ago is how long before now t was, rounded for reading ("3s ago").
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return dur(now.Sub(t)) + " ago"
}

// dur rounds d to what a reader needs: ms under a second, s under an
// hour, then minutes.
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Minute).String()
	}
}

// jobTable is one list of jobs on the page.
type jobTable struct {
	Title string
	Rows  []JobRow
	Now   time.Time
}
