// Package ghsim is an in-process GitHub simulator for Berth's end-to-end tests.
//
// It mimics the parts of GitHub that an ephemeral-runner fleet manager touches:
//
//   - the REST API (JIT runner configs, runner list/get/delete, workflow jobs and
//     runs, installation tokens, rate limit), with bodies shaped from the real
//     fixtures in shared/fixtures/github/api and GitHub's X-RateLimit-* headers;
//   - workflow_job webhooks (queued, in_progress, completed) built from the real
//     fixture payloads in shared/fixtures/github/webhooks and signed with
//     X-Hub-Signature-256, delivered asynchronously and in order, never retried;
//   - a small sim-only runner protocol (/_sim/runner/...) through which a JIT runner
//     (see RunRunner and the ghsim binary) connects, is handed any queued job whose
//     labels it satisfies, "runs" it and reports completion.
//
// A Sim must be released with Close, which stops the HTTP server and the webhook
// sender and waits for their goroutines.
package ghsim

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultAcquireTimeout is how long POST /_sim/runner/acquire long-polls before
// answering 204 No Content, like the real runner's 50 s message long-poll.
const DefaultAcquireTimeout = 50 * time.Second

// webhookTimeout is GitHub's delivery timeout: a hook that does not answer within
// 10 s is recorded as failed.
const webhookTimeout = 10 * time.Second

// Config configures a Sim.
type Config struct {
	// WebhookURL is where workflow_job webhooks are POSTed, e.g.
	// http://127.0.0.1:8080/webhook. Empty disables delivery (deliveries are still
	// recorded, with Err set).
	WebhookURL string
	// WebhookSecret is the HMAC-SHA256 key for the X-Hub-Signature-256 header.
	WebhookSecret string
	// Org and Repo name the only organization and repository the sim knows, e.g.
	// "example-org" and "example-repo". REST paths naming another owner 404, and
	// webhook payloads carry these names.
	Org, Repo string
	// FixturesDir is the path to shared/fixtures/github (the directory holding
	// api/ and webhooks/). Required.
	FixturesDir string
	// Logger receives debug/info logs; nil discards them.
	Logger *slog.Logger
	// PublicURL is the base URL put in what the sim hands out (JIT configs,
	// payload links) when clients reach it by another name than its listen
	// address, e.g. "http://sim:9000" on a compose network. Empty: the
	// listen address.
	PublicURL string
	// AcquireTimeout overrides DefaultAcquireTimeout for the runner long-poll
	// (useful in tests). Zero means DefaultAcquireTimeout.
	AcquireTimeout time.Duration
	// RateLimitPerHour is the core budget the rate-limit headers count
	// down; 0 means 15,000, a GitHub App installation's. A client that
	// reads "remaining 0" waits for the reset, an hour: a bench that makes
	// more calls than that in an hour measures the budget, not Berth.
	RateLimitPerHour int
	// ReofferAfter is how long a scale-set job may wait unacquired before
	// it is offered again; 0 means DefaultReofferAfter.
	ReofferAfter time.Duration
	// HookSenders is how many webhook deliveries are in flight at once;
	// 0 or 1: one at a time, in production order. GitHub delivers
	// concurrently and promises no order ("Best practices for using
	// webhooks": deliveries may arrive out of order); a job's own
	// deliveries keep theirs here (each job's go to one sender, by job
	// id), so a bench measures the receiver, not a single queue in front
	// of it.
	HookSenders int
	// KeepDeliveries bounds the deliveries the sim remembers (Deliveries,
	// the hook deliveries API, Redeliver) to about the newest this many,
	// bodies and all; 0 keeps every one. GitHub keeps a hook's deliveries
	// for 3 days, outside the receiver's process; a bench that runs
	// 100,000 jobs in the process it measures would otherwise hold some
	// 25 KiB of payloads a job (three real-sized webhooks) for the run.
	KeepDeliveries int
}

// Sim is a simulated GitHub. All methods are safe for concurrent use.
type Sim struct {
	minted     []string // encoded JIT configs and runner tokens handed out (secrets.go)
	cfg        Config
	log        *slog.Logger
	fx         *fixtures
	members    map[string]*hookMembers // hookMembersLocked, by template kind
	hookID     int64
	acquireTTL time.Duration
	handler    http.Handler
	hookClient *http.Client
	sendCtx    context.Context
	cancelSend context.CancelFunc
	wg         sync.WaitGroup
	wake       []chan struct{} // per sender, cap 1: new webhook queued
	stop       chan struct{}   // closed by Close

	accepted atomic.Int64 // connections the server accepted

	mu      sync.Mutex
	baseURL string
	srv     *http.Server
	closed  bool
	jobs    []*job // in enqueue (FIFO) order
	// firstOpen indexes jobs: every job before it has been taken or
	// ended. A job only moves forward (queued, in progress, completed), so
	// one taken never becomes open again, and a pick starts here instead
	// of at the first job ever enqueued (openJobs): over 100,000 jobs the
	// walk from the start was 8% of the bench's CPU and grew with the run.
	firstOpen int
	// byLabels and indexed: the jobs a runner of no scale set may take,
	// by label set (restJobsLocked), and how many of jobs, from the first,
	// it has been given.
	byLabels map[string]*labelQueue
	indexed  int
	jobByID  map[int64]*job
	runners  map[int64]*runner // registered runners only
	// runnerNames: each registered runner's id by its name in lower case,
	// so a registration checks GitHub's unique-name rule without a walk
	// over every runner (10,000 runners made each mint a scan).
	runnerNames map[string]int64
	tokens      map[string]*runner
	labelIDs    map[string]int64
	nextJobID   int64
	nextRunID   int64
	nextRunner  int64
	changed     chan struct{} // closed and replaced on every job/runner change
	deliveries  []*delivery
	outbox      [][]*delivery // per sender, in production order
	apiCalls    map[string]int
	rlUsed      int
	rlReset     time.Time
	nextHookNo  int64                   // id of the next delivery attempt (hook deliveries API)
	lose        func(DeliveryView) bool // deliveries to fail (LoseDeliveries)
	timeOut     func(DeliveryView) bool // deliveries sent but recorded as timed out (TimeOutDeliveries)
	loseJIT     func(name string) bool  // JIT answers to lose after registering (LoseJITAnswers)
	limits      map[string]*rateLimit   // route → rate-limit answers due (RateLimit)

	// route → refuse until then (Unauthorized, NotFound)
	unauthorized map[string]refusal

	// runner scale sets (scaleset*.go)
	sets        map[int]*scaleSet
	nextSet     int
	regTokens   map[string]bool // registration tokens handed out
	adminTokens map[string]bool // actions service admin tokens handed out
	msgFault    func(MessageView) (MessageFault, time.Duration)
}

// New loads and parses the fixtures once and starts the webhook sender goroutine.
// It returns an error if Org, Repo or FixturesDir is empty or a fixture is missing
// or malformed. The returned Sim does not listen until Start; its Handler can also
// be mounted on any server (e.g. httptest.NewServer).
func New(cfg Config) (*Sim, error) {
	if cfg.Org == "" || cfg.Repo == "" {
		return nil, errors.New("ghsim: Config.Org and Config.Repo are required")
	}
	fx, err := loadFixtures(cfg.FixturesDir)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ttl := cfg.AcquireTimeout
	if ttl <= 0 {
		ttl = DefaultAcquireTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sim{
		cfg:         cfg,
		log:         log.With("component", "ghsim"),
		fx:          fx,
		hookID:      400000000 + randInt63()%100000000,
		acquireTTL:  ttl,
		hookClient:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(cfg.HookSenders, 2)}},
		sendCtx:     ctx,
		cancelSend:  cancel,
		stop:        make(chan struct{}),
		jobByID:     map[int64]*job{},
		runners:     map[int64]*runner{},
		runnerNames: map[string]int64{},
		tokens:      map[string]*runner{},
		labelIDs:    map[string]int64{},
		nextJobID:   20000000000 + randInt63()%1000000*1000,
		nextRunID:   7000000000 + randInt63()%1000000*1000,
		nextRunner:  100,
		changed:     make(chan struct{}),
		apiCalls:    map[string]int{},
		rlReset:     time.Now().Add(time.Hour),
		nextHookNo:  90000000000 + randInt63()%1000000*1000,
		sets:        map[int]*scaleSet{},
		regTokens:   map[string]bool{},
		adminTokens: map[string]bool{},
	}
	s.handler = s.routes()
	senders := max(cfg.HookSenders, 1)
	s.outbox, s.wake = make([][]*delivery, senders), make([]chan struct{}, senders)
	for i := range senders {
		s.wake[i] = make(chan struct{}, 1)
		s.wg.Add(1)
		go s.sendLoop(i)
	}
	return s, nil
}

// Handler returns the http.Handler serving GitHub's REST routes and the sim-only
// runner protocol under /_sim/runner/. When the handler is mounted on a foreign
// server (no Start), the sim derives its base URL from each request's Host.
func (s *Sim) Handler() http.Handler { return s.handler }

// Start listens on addr (e.g. "127.0.0.1:0") and serves Handler in a goroutine.
// It returns the base URL, e.g. "http://127.0.0.1:PORT", without a trailing slash
// and without GitHub Enterprise's /api/v3 prefix. Start may be called once.
func (s *Sim) Start(addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errors.New("ghsim: Start after Close")
	}
	if s.srv != nil {
		return "", errors.New("ghsim: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("ghsim: listen %s: %w", addr, err)
	}
	s.baseURL = "http://" + ln.Addr().String()
	if s.cfg.PublicURL != "" {
		s.baseURL = strings.TrimSuffix(s.cfg.PublicURL, "/")
	}
	s.srv = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.accepted.Add(1)
			}
		}}
	srv := s.srv
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve failed", "err", err)
		}
	}()
	s.log.Info("listening", "url", s.baseURL)
	return s.baseURL, nil
}

// Accepted is how many connections the sim's server has accepted since
// Start: GitHub's clients (the dispatcher's API calls, every runner's)
// each dial it, so the bench can tell connection churn from requests.
func (s *Sim) Accepted() int64 { return s.accepted.Load() }

// URL returns the base URL from Start, or "" if the sim was not started.
func (s *Sim) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.baseURL
}

// SetWebhookURL points the webhooks sent from now on at url: a receiver
// that binds its port only after the sim started (port 0, its address
// known once it listens) is told where it listens this way, rather than
// being handed a port found free a moment before, which another process
// may take first.
func (s *Sim) SetWebhookURL(url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.WebhookURL = url
}

// Close releases pending runner long-polls (they get 503), shuts the HTTP server
// down, aborts an in-flight webhook, records still-queued deliveries as not sent
// (Err "sim closed") and waits for all goroutines. Close is idempotent.
func (s *Sim) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	srv := s.srv
	s.mu.Unlock()

	var err error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = srv.Shutdown(ctx)
		cancel()
		if err != nil {
			_ = srv.Close()
		}
	}
	s.cancelSend()
	s.wg.Wait()
	s.hookClient.CloseIdleConnections()
	return err
}

// baseURLFor returns the sim's base URL, falling back to the request's Host when
// the handler is served by a foreign server.
func (s *Sim) baseURLFor(r *http.Request) string {
	s.mu.Lock()
	u := s.baseURL
	s.mu.Unlock()
	if u != "" || r == nil {
		return u
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// notifyLocked wakes every runner long-poll; callers hold s.mu.
func (s *Sim) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// randInt63 returns a non-negative random int64 from crypto/rand.
func randInt63() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) >> 1)
}

// randHex returns n random bytes hex-encoded.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// newUUID returns a random (version 4) UUID string, the format of X-GitHub-Delivery.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
