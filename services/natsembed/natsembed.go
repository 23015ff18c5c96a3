// Package natsembed starts a nats-server inside this process: the one of
// `berth dev`, the demo's, and the tests'. Only wiring (services/run, the
// commands, the demo) and tests import it; services reach NATS through a
// client connection alone.
package natsembed

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures the in-process nats-server of `berth dev`.
type EmbeddedConfig struct {
	// Listen is host:port for clients; "127.0.0.1:4222" lets the nats CLI
	// look in with its defaults. Port 0 picks a free port.
	Listen string
	// StoreDir holds JetStream's files.
	StoreDir string
	// MaxPayload is the largest message in bytes; 0 means 4 MiB.
	MaxPayload int32
}

// StartEmbedded starts a JetStream-enabled nats-server in this process and
// waits (up to 10 s) until it accepts clients. The caller owns it:
// Shutdown then WaitForShutdown.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("embedded nats listen %q: %w (use host:port, e.g. 127.0.0.1:4222)", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded nats port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else if err := free(cfg.Listen, portStr); err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName: "berth-dev",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: cmp.Or(cfg.MaxPayload, 4<<20),
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats on %s not ready after 10s: is the port in use? pick another with --nats-listen (make demo: DEMO_FLAGS=-nats-listen=127.0.0.1:0)", cfg.Listen)
	}
	return s, nil
}

// free says at once when addr is taken (another nats-server, or a demo
// still running): nats-server itself would only fail to get ready, after
// ReadyForConnections' 10 s, without saying why.
func free(addr, port string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("embedded nats cannot listen on %s: %w; stop what holds it (ss -ltnp | grep :%s) or pick another address with --nats-listen (127.0.0.1:0 takes any free port; make demo: DEMO_FLAGS=-nats-listen=127.0.0.1:0)",
			addr, err, port)
	}
	return ln.Close()
}
