package main

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// checkNATSURL refuses a --nats value no server could be behind, before
// any dial: nats.go would report it as "no servers available" or a DNS
// failure, which reads as a server that is down. s is one URL or several
// separated by commas; each may omit its scheme (nats:// is meant, as
// nats.go does).
func checkNATSURL(s string) error {
	for _, u := range strings.Split(s, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			return fmt.Errorf("--nats %q: an empty URL between commas: give nats://HOST:PORT (several: comma-separated, none empty)", s)
		}
		full := u
		if !strings.Contains(u, "://") {
			full = "nats://" + u
		}
		p, err := url.Parse(full)
		if err != nil {
			return fmt.Errorf("--nats %q: %v: give nats://HOST:PORT (several: comma-separated)", u, err)
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("--nats %q: scheme %q: a NATS URL is nats://HOST:PORT (or tls://, ws://, wss://)", u, p.Scheme)
		}
		if p.Host == "" || (p.Path != "" && p.Path != "/") || p.RawQuery != "" {
			return fmt.Errorf("--nats %q: not HOST:PORT: give nats://HOST:PORT (several: comma-separated)", u)
		}
		if _, _, err := net.SplitHostPort(p.Host); strings.Contains(p.Host, ":") && !strings.HasPrefix(p.Host, "[") && err != nil {
			return fmt.Errorf("--nats %q: %v: give nats://HOST:PORT (several: comma-separated)", u, err)
		}
		if port := p.Port(); port != "" {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("--nats %q: port %s: give nats://HOST:PORT with a port from 1 to 65535 (NATS listens on 4222 by default)", u, port)
			}
		}
	}
	return nil
}
