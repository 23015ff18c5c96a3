// Package page is the operator's read-only page: the fleet at a glance in
// a browser, served by the dispatcher from the projection `berth status
// --json` prints (events.Fleet.Status plus the heartbeats, see
// cli.WithHeartbeats), live through server-sent events, and a plain
// refresh without script.
//
// It is safe by default: the dispatcher binds it to loopback unless
// configured (config.Page); it can require a token or basic auth; no page
// holds a secret, a JIT config or a webhook payload (the templates see
// only View, JobRow and Fact, built from allowlisted fields); and it
// answers GET only, so it can perform no operator action (cordon, drain
// and release stay in the CLI).
package page

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/nats-io/nats.go/jetstream"
)

//go:embed assets
var assets embed.FS

// Options configure a Server.
type Options struct {
	// Read runs fn on the live fold and waits for it (the dispatcher's
	// Shell.Read); fn must not keep the fold.
	Read func(ctx context.Context, fn func(*events.Fleet)) error
	// JS reads the heartbeat bucket and a job's facts; nil shows neither.
	JS jetstream.JetStream
	// Stream, when set, says whether the stream is as configured, and how
	// it drifts from it.
	Stream func() (ok bool, drift []string)
	Auth   Auth
	// Poll is how often the page looks for a new fact (default 250 ms):
	// a change shows in the browser within Poll plus a render.
	Poll time.Duration
	// Refresh re-renders without a new fact (ages, heartbeats; default 2 s).
	Refresh time.Duration
	// Sample is the period of the held-and-demand pictures (default 5 s).
	Sample time.Duration
	Now    func() time.Time
	Logger *slog.Logger
}

// Auth is the page's optional access control: a token (as a bearer
// header, or once as ?token= which sets a cookie), basic auth, or both
// (either admits). Empty: anyone who reaches the address may read.
type Auth struct {
	Token          string
	User, Password string
}

func (a Auth) open() bool { return a.Token == "" && a.User == "" }

// minGap is the least wall time between two renders for new facts: a
// busy log costs the dispatcher's loop two status reads a second at most.
const minGap = 400 * time.Millisecond

// Server renders the page and follows the fold.
type Server struct {
	o    Options
	tmpl *template.Template
	csp  string

	hist *history

	mu      sync.Mutex
	seq     uint64    // the fold's sequence main shows
	version uint64    // renders so far: a stream sends each once
	wall    time.Time // when main was last rendered (wall clock: it paces the reads)
	main    []byte    // the live part, rendered
	changed chan struct{}
	done    chan struct{}
}

// New parses the embedded templates.
func New(o Options) (*Server, error) {
	if o.Read == nil {
		return nil, errors.New("page: Options.Read is required")
	}
	if o.Poll <= 0 {
		o.Poll = 250 * time.Millisecond
	}
	if o.Refresh <= 0 {
		o.Refresh = 2 * time.Second
	}
	if o.Sample <= 0 {
		o.Sample = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	script, err := assets.ReadFile("assets/live.js")
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(script)
	t, err := template.New("page").Funcs(funcs(template.JS(script))).ParseFS(assets, "assets/*.tmpl")
	if err != nil {
		return nil, err
	}
	// Only the embedded script runs, and it may only talk to this origin.
	csp := "default-src 'none'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; script-src 'sha256-" +
		base64.StdEncoding.EncodeToString(sum[:]) + "'"
	return &Server{o: o, tmpl: t, csp: csp, hist: newHistory(o.Sample), changed: make(chan struct{}), done: make(chan struct{})}, nil
}

// Run follows the fold until ctx ends: every Poll it asks for the fold's
// sequence and renders the live part when a fact arrived (or Refresh
// passed), waking every open stream.
func (s *Server) Run(ctx context.Context) error {
	defer close(s.done)
	t := time.NewTicker(s.o.Poll)
	defer t.Stop()
	for {
		if err := s.refresh(ctx); err != nil && ctx.Err() == nil {
			s.o.Logger.Debug("page: render failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refresh renders the live part when the fold moved or Refresh passed.
func (s *Server) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var seq uint64
	if err := s.o.Read(ctx, func(f *events.Fleet) { seq = f.LastSeq }); err != nil {
		return err
	}
	now := s.o.Now()
	s.mu.Lock()
	// A new fact renders at most every minGap of wall time (the fold is
	// read on the dispatcher's loop); ages and heartbeats every Refresh.
	gap := time.Since(s.wall)
	stale := s.main == nil || (seq != s.seq && gap >= minGap) || gap >= s.o.Refresh
	s.mu.Unlock()
	if !stale {
		return nil
	}
	v, err := s.view(ctx, now)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := s.tmpl.ExecuteTemplate(&b, "main", v); err != nil {
		return err
	}
	s.mu.Lock()
	s.seq, s.wall, s.main = v.Status.AsOfSeq, time.Now(), b.Bytes()
	s.version++
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// view reads the fold once and builds what the page shows.
func (s *Server) view(ctx context.Context, now time.Time) (View, error) {
	var v View
	read := func(f *events.Fleet) { v = build(f, f.Status(), now) }
	if err := s.o.Read(ctx, read); err != nil {
		return View{}, err
	}
	v.order()
	if s.o.JS != nil {
		v.Status = cli.WithHeartbeats(ctx, s.o.JS, v.Status)
	}
	v.StreamOK = true
	if s.o.Stream != nil {
		v.StreamOK, v.Stream = s.o.Stream()
	}
	s.mu.Lock()
	s.hist.add(v.Status, now)
	for i := range v.Charts {
		v.Charts[i].Samples = s.hist.of(v.Charts[i].Pool)
	}
	s.mu.Unlock()
	return v, nil
}

// live is the last rendered live part and the channel closed when the
// next one is ready.
func (s *Server) live() (main []byte, seq, version uint64, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.main, s.seq, s.version, s.changed
}

// Handler serves the page: GET only (any other method is refused with
// 405), behind Auth.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.index)
	mux.HandleFunc("GET /live", s.stream)
	mux.HandleFunc("GET /job/{id}", s.job)
	return s.guard(mux)
}

// guard adds the headers every answer carries and checks Auth.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", s.csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "the page is read-only: cordon, drain and release are `berth` commands", http.StatusMethodNotAllowed)
			return
		}
		if !s.admit(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

const tokenCookie = "page_token"

// admit checks the request against Auth; a valid ?token= is moved into a
// cookie (HttpOnly, SameSite=Strict) and the URL is cleaned of it.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) bool {
	a := s.o.Auth
	if a.open() {
		return true
	}
	if a.Token != "" {
		if q := r.URL.Query().Get("token"); q != "" && equal(q, a.Token) {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: a.Token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			u := *r.URL
			qs := u.Query()
			qs.Del("token")
			u.RawQuery = qs.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return false
		}
		if c, err := r.Cookie(tokenCookie); err == nil && equal(c.Value, a.Token) {
			return true
		}
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(b, a.Token) {
			return true
		}
	}
	if a.User != "" {
		if u, p, ok := r.BasicAuth(); ok && equal(u, a.User) && equal(p, a.Password) {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="berth", charset="UTF-8"`)
	}
	http.Error(w, "unauthorized: open the page with ?token=… or the basic-auth user from the dispatcher's page config", http.StatusUnauthorized)
	return false
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// index is the whole page with the live part as last rendered.
func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	main, _, _, _ := s.live()
	if main == nil {
		if err := s.refresh(r.Context()); err != nil {
			http.Error(w, "the dispatcher's fold did not answer: "+err.Error()+" (see its /healthz)", http.StatusServiceUnavailable)
			return
		}
		main, _, _, _ = s.live()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = s.tmpl.ExecuteTemplate(w, "index", template.HTML(main)) // #nosec: rendered by the "main" template
}

// stream sends the live part as server-sent events: at once, then on
// every change, until the client leaves or the server stops.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // a stream outlives the server's WriteTimeout
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 1000\n\n")
	var sent uint64
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		main, seq, version, changed := s.live()
		if main != nil && version != sent {
			if err := writeEvent(w, strconv.FormatUint(seq, 10), main); err != nil {
				return
			}
			sent = version
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
		case <-changed:
		}
	}
}

// writeEvent writes one SSE message whose data is b, line by line.
func writeEvent(w http.ResponseWriter, id string, b []byte) error {
	var out bytes.Buffer
	fmt.Fprintf(&out, "id: %s\n", id)
	for _, line := range bytes.Split(b, []byte("\n")) {
		out.WriteString("data: ")
		out.Write(bytes.TrimRight(line, "\r"))
		out.WriteByte('\n')
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// job is one job's timeline: its row, its attempts as the fold sums them
// up, and its facts from the log.
func (s *Server) job(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "a job id is a positive number (GitHub's workflow job id), as the page's job list links it", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	now := s.o.Now()
	var tl Timeline
	var found bool
	var wh where
	err = s.o.Read(ctx, func(f *events.Fleet) {
		wh, tl.Attempts = attemptsOf(f, id)
		if j, ok := f.Jobs[id]; ok {
			found, tl.Job = true, jobRow(j, now, len(tl.Attempts))
		}
	})
	if err != nil {
		http.Error(w, "the dispatcher's fold did not answer: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if !found {
		tl.Job = JobRow{ID: id, Status: "not in the projection (never seen, or past the retention)"}
	}
	if s.o.JS != nil {
		tl.Facts, tl.Truncated, err = readFacts(ctx, s.o.JS, wh)
		if err != nil {
			http.Error(w, "reading the job's facts from the log: "+err.Error()+" (try `berth events --job "+strconv.FormatInt(id, 10)+"`)", http.StatusServiceUnavailable)
			return
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if !found && len(tl.Facts) == 0 {
		w.WriteHeader(http.StatusNotFound)
	}
	_ = s.tmpl.ExecuteTemplate(w, "job", tl)
}
