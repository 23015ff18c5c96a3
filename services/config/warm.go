package config

import (
	"fmt"
	"strings"
	"time"
)

// WarmPool is one pool's warm target (dispatcher.warm_pools.<pool>, issue 8):
// how many VMs wait, booted, before their jobs arrive.
type WarmPool struct {
	// MinIdle is how many warm VMs (booting or idle) the pool keeps.
	MinIdle int `yaml:"min_idle"`
	// MaxIdleAge recycles an idle VM older than this (0: 1h).
	MaxIdleAge time.Duration `yaml:"max_idle_age"`
	// TimeZone is the IANA zone the schedule's windows are read in
	// (default UTC), e.g. Europe/Berlin.
	TimeZone string `yaml:"time_zone"`
	// Schedule raises or lowers min_idle while a window is open; the first
	// open window wins.
	Schedule []WarmWindow `yaml:"schedule"`
	// Hosts keeps at least this many of the pool's warm VMs on each named
	// host (they count toward min_idle).
	Hosts map[string]int `yaml:"hosts"`
}

// WarmWindow: on Days ("mon-fri", "sat,sun"; empty: every day) from From to
// To ("HH:MM"; To at or before From spans midnight), keep MinIdle.
type WarmWindow struct {
	Days    string `yaml:"days"`
	From    string `yaml:"from"`
	To      string `yaml:"to"`
	MinIdle int    `yaml:"min_idle"`
}

var weekdays = map[string]time.Weekday{"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday,
	"wed": time.Wednesday, "thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday}

// ParseDays reads "mon-fri", "sat,sun" or "mon,wed-fri" (empty: every day).
func ParseDays(s string) ([]time.Weekday, error) {
	var out []time.Weekday
	for _, part := range strings.Split(strings.ToLower(strings.ReplaceAll(s, " ", "")), ",") {
		if part == "" {
			continue
		}
		from, to, isRange := strings.Cut(part, "-")
		a, ok1 := weekdays[from]
		b, ok2 := weekdays[to]
		if !ok1 || (isRange && !ok2) {
			return nil, fmt.Errorf("days %q: use mon..sun, ranges like mon-fri, and commas", s)
		}
		if !isRange {
			b = a
		}
		for d := a; ; d = (d + 1) % 7 {
			out = append(out, d)
			if d == b {
				break
			}
		}
	}
	return out, nil
}

// ParseClock reads "HH:MM" as minutes after midnight.
func ParseClock(s string) (int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, fmt.Errorf("time %q: use HH:MM, 24-hour", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

func (c *Config) validateWarm(bad func(string, ...any)) {
	for pool, w := range c.Dispatcher.WarmPools {
		at := "dispatcher.warm_pools." + pool
		if w.MinIdle < 0 || w.MaxIdleAge < 0 {
			bad("%s: min_idle and max_idle_age must not be negative", at)
		}
		for h, n := range w.Hosts {
			if n < 0 {
				bad("%s.hosts.%s: %d must not be negative", at, h, n)
			}
		}
		if w.TimeZone != "" {
			if _, err := time.LoadLocation(w.TimeZone); err != nil {
				bad("%s.time_zone %q: %v (use an IANA name such as Europe/Berlin)", at, w.TimeZone, err)
			}
		}
		for i, win := range w.Schedule {
			if _, err := ParseDays(win.Days); err != nil {
				bad("%s.schedule[%d]: %v", at, i, err)
			}
			for _, s := range []string{win.From, win.To} {
				if _, err := ParseClock(s); err != nil {
					bad("%s.schedule[%d]: %v", at, i, err)
				}
			}
			if win.MinIdle < 0 {
				bad("%s.schedule[%d].min_idle must not be negative", at, i)
			}
		}
	}
}
