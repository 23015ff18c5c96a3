// Package httpx serves a service's HTTP endpoints: /healthz (JSON, 503 when
// degraded) and /metrics (Prometheus), plus any service routes.
package httpx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// HealthFunc reports whether the service is healthy and a JSON-able detail.
type HealthFunc func() (ok bool, detail any)

// Mux returns a mux with /healthz and /metrics.
func Mux(reg *prometheus.Registry, health HealthFunc) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, detail := health()
		w.Header().Set("Content-Type", "application/json")
		status := "ok"
		if !ok {
			status = "degraded"
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "detail": detail})
	})
	return mux
}

// Serve listens on addr and serves h until ctx ends, then shuts down within
// 5 s. ready, when not nil, receives the bound address (useful with port 0).
func Serve(ctx context.Context, addr string, h http.Handler, ready chan<- string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another Berth running? choose another address)", addr, err)
	}
	if ready != nil {
		ready <- ln.Addr().String()
	}
	return ServeOn(ctx, ln, h)
}

// ServeOn is Serve on a listener the caller opened (and ServeOn closes).
func ServeOn(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 15 * time.Second, IdleTimeout: 60 * time.Second}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
