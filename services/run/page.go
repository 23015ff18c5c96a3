package run

import (
	"context"
	"log/slog"
	"net"
	"os"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/httpx"
	"github.com/berth-ci/berth/services/page"
	"github.com/nats-io/nats.go/jetstream"
)

// servePage serves the operator's read-only page (services/page) from the
// dispatcher's live fold on its own listener (dispatcher.page.listen,
// loopback by default), unless it is "off". It sets s.PageAddr.
func servePage(ctx context.Context, s *System, cfg *config.Config, read func(context.Context, func(*events.Fleet)) error,
	js jetstream.JetStream, stream func() (bool, []string), logger *slog.Logger) error {
	pc := cfg.Dispatcher.Page
	if pc.Listen == config.PageOff {
		return nil
	}
	p, err := page.New(page.Options{Read: read, JS: js, Logger: logger, Stream: stream,
		Auth: page.Auth{Token: config.Secret(pc.Token, pc.TokenEnv), User: pc.User, Password: config.Secret(pc.Password, pc.PasswordEnv)}})
	if err != nil {
		return err
	}
	// The page is the operator's window, not the dispatcher's work: an
	// address already taken (another dispatcher on this machine) costs
	// the page, never the webhook intake.
	ln, err := net.Listen("tcp", pc.Listen)
	if err != nil {
		logger.Error("the operator's page is not served: its address is taken; set dispatcher.page.listen to a free one (or off)",
			"addr", pc.Listen, "err", err)
		return nil
	}
	s.goRun("page", func() error { return p.Run(ctx) })
	s.goRun("page http", func() error { return httpx.ServeOn(ctx, ln, p.Handler()) })
	addr, wide := browsable(ln.Addr().String())
	s.PageAddr = addr
	auth := pc.Token != "" || pc.TokenEnv != "" || pc.User != ""
	logger.Info("the operator's page is served", "addr", "http://"+addr+"/", "listen", pc.Listen, "auth", auth)
	if wide && !auth {
		logger.Warn("the operator's page listens beyond loopback with no auth: anyone who reaches this port reads the fleet; "+
			"set dispatcher.page.token_env (or user and password_env), or listen on 127.0.0.1", "listen", pc.Listen)
	}
	return nil
}

// browsable turns a listener's address into one a browser opens: a
// wildcard (0.0.0.0, ::) becomes this machine's name, and wide says the
// page is reachable beyond loopback.
func browsable(addr string) (string, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, false
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return addr, host != "localhost"
	case ip.IsLoopback():
		return addr, false
	case ip.IsUnspecified():
		name, err := os.Hostname()
		if err != nil || name == "" {
			name = "127.0.0.1"
		}
		return net.JoinHostPort(name, port), true
	}
	return addr, true
}

// streamOf is the stream's health and drift for the page, from the
// dispatcher's stream check.
func streamOf(sh *streamHealth) func() (bool, []string) {
	return func() (bool, []string) {
		detail := map[string]any{}
		ok := sh.add(true, detail)
		drift, _ := detail["stream_drift"].([]string)
		return ok, drift
	}
}
