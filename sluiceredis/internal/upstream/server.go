// Package upstream provides a fake rate-limited HTTP API for sluice's tests.
//
// A [Server] enforces a GCRA rate limit and/or a fixed-window quota
// (advertised with IETF RateLimit / RateLimit-Policy headers), answers
// refused requests with 429 and a configurable Retry-After, simulates
// service time and bounded server parallelism, and records every request
// it sees as an [Arrival] so tests can check pacing invariants.
//
// [New] serves over an in-memory listener and works both in real time and
// inside a testing/synctest bubble, where all of its sleeps and timers run
// on the bubble's virtual clock. [NewTCP] serves over real loopback TCP and
// must not be used inside a bubble.
package upstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// RetryAfterMode selects what a 429 response says in its Retry-After header.
type RetryAfterMode int

const (
	// RetryAfterSeconds (the default) sends the number of whole seconds until
	// the next request would be accepted, rounded up, and at least 1.
	RetryAfterSeconds RetryAfterMode = iota
	// RetryAfterNone sends no Retry-After header.
	RetryAfterNone
	// RetryAfterFixed sends Config.RetryAfterValue verbatim, whatever it is
	// (for hostile tests: "NaN", "-1", "99999999999", "").
	RetryAfterFixed
	// RetryAfterDate sends an HTTP-date (RFC 9110) no earlier than the
	// instant the next request would be accepted (rounded up to the second).
	RetryAfterDate
)

// Config describes the behaviour of a [Server]. The zero Config is an
// unlimited server that answers every request at once with 200 "ok\n".
type Config struct {
	// Rate and Burst configure a GCRA limiter with emission interval 1/Rate
	// and tolerance (Burst-1)/Rate. Burst 1 (or less) is strict: a request
	// arriving even 1ns before its theoretical arrival time is refused.
	// Rate 0 disables the limiter. Refused requests do not advance the
	// GCRA state. Both may be changed at run time with [Server.SetRate].
	Rate  float64
	Burst int

	// RetryAfter selects the Retry-After header sent on 429 responses.
	// RetryAfterValue is the header value for RetryAfterFixed; setting it
	// with any other mode is a configuration error and makes New panic.
	RetryAfter      RetryAfterMode
	RetryAfterValue string

	// When PolicyWindow > 0, a fixed-window quota of Quota requests per
	// PolicyWindow (windows aligned to the server's start time) is enforced
	// in addition to Rate/Burst, and every response carries
	//
	//	RateLimit-Policy: "default";q=<Quota>;w=<window seconds>
	//	RateLimit: "default";r=<remaining>;t=<seconds until the window resets>
	//
	// Seconds are rounded up. Requests beyond the quota get 429 (with
	// Retry-After per RetryAfter) and, like GCRA refusals, do not consume
	// quota. Quota <= 0 refuses every request.
	Quota        int
	PolicyWindow time.Duration

	// Latency returns the service time of the n-th accepted request
	// (n counts accepted requests from 0); nil means 0. It is applied only
	// to accepted requests, after any MaxConcurrent queueing: a 429 is
	// answered at once. It may be replaced with [Server.SetLatency].
	Latency func(n int, r *http.Request) time.Duration

	// MaxConcurrent K > 0 lets at most K accepted requests be in service at
	// once; the others wait in a FIFO queue inside the server, so the
	// latency the client sees grows with its concurrency. 0 = unlimited.
	MaxConcurrent int

	// Handler, if set, writes the response for accepted requests once
	// their latency has elapsed; it may read the request body, which has
	// already been buffered. Default: 200 with body "ok\n".
	Handler http.HandlerFunc

	// Limiter, if set, decides every request instead of Rate/Burst and
	// the quota window (setting it with either of those is a configuration
	// error and makes New panic), and publishes its own headers: see
	// models.go for the server models of real APIs and middlewares.
	Limiter Limiter
}

// Arrival records one request seen by a [Server].
type Arrival struct {
	At       time.Time // when the request reached the handler and was admitted or refused
	Started  time.Time // when service began, after MaxConcurrent queueing; zero if refused or abandoned while queued
	Done     time.Time // when the response was written; zero while the request is still in the server
	Accepted bool      // whether the rate limiter and quota admitted the request
	Class    string    // request header "X-Class"
	Tenant   string    // request header "X-Tenant"
	Status   int       // response status; 0 if abandoned (client gone or server closed) before a response was written
	Method   string
	Path     string
	BodyHash string // hex SHA-256 of the request body ("" until the body has been read)
	// InFlight is the number of accepted requests in service at once,
	// including this one, when this request's service began (equal to the
	// arrival instant unless it queued behind MaxConcurrent). For refused
	// requests it is the number in service at arrival, not including it.
	InFlight int
}

// Server is a fake rate-limited API. Create it with [New] or [NewTCP] and
// always [Server.Close] it. All methods are safe for concurrent use.
type Server struct {
	cfg   Config
	start time.Time
	hs    *httptest.Server
	ln    *pipeListener // nil for NewTCP
	tr    *http.Transport
	done  chan struct{} // closed by Close: aborts sleeping and queued handlers

	closeOnce sync.Once

	// mu guards everything below. It is never held while blocking.
	mu             sync.Mutex
	rate           float64
	burst          int
	tat            time.Time // GCRA theoretical arrival time
	latency        func(int, *http.Request) time.Duration
	winIdx         int64 // index of the current quota window
	winCount       int   // requests accepted in the current quota window
	accepted       int
	rejected       int
	arrivals       []Arrival
	inService      int
	maxInService   int
	outstanding    int // accepted requests in the server, queued or in service
	maxOutstanding int
	waiters        []chan int // FIFO queue of requests waiting for a MaxConcurrent slot
}

var hostSeq atomic.Int64

// New starts a Server on an in-memory listener and returns it. It works
// inside a testing/synctest bubble (call it inside the bubble, and Close it
// there too) as well as outside one. Only the [Server.Transport] can reach
// it; its URL host is a unique, unresolvable name such as
// "upstream-1.test". New panics if cfg is invalid.
func New(cfg Config) *Server {
	s := newServer(cfg)
	s.ln = newPipeListener(fmt.Sprintf("upstream-%d.test", hostSeq.Add(1)))
	// Built directly rather than with httptest.NewUnstartedServer, which
	// would open (and make us close) a real TCP socket.
	s.hs = &httptest.Server{Listener: s.ln, Config: &http.Server{Handler: s}}
	s.tr = newTransport(s.ln.Dial)
	s.hs.Start()
	return s
}

// NewTCP starts a Server on a real loopback TCP port and returns it, for
// tests (such as benchmarks) that want a real network stack. It must not
// be used inside a testing/synctest bubble. NewTCP panics if cfg is invalid.
func NewTCP(cfg Config) *Server {
	s := newServer(cfg)
	s.hs = httptest.NewServer(s)
	s.tr = newTransport((&net.Dialer{}).DialContext)
	return s
}

func newServer(cfg Config) *Server {
	switch {
	case cfg.Rate < 0 || math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0):
		panic(fmt.Sprintf("upstream: invalid Rate %v", cfg.Rate))
	case cfg.PolicyWindow < 0:
		panic(fmt.Sprintf("upstream: negative PolicyWindow %v", cfg.PolicyWindow))
	case cfg.MaxConcurrent < 0:
		panic(fmt.Sprintf("upstream: negative MaxConcurrent %d", cfg.MaxConcurrent))
	case cfg.RetryAfter < RetryAfterSeconds || cfg.RetryAfter > RetryAfterDate:
		panic(fmt.Sprintf("upstream: unknown RetryAfterMode %d", cfg.RetryAfter))
	case cfg.RetryAfterValue != "" && cfg.RetryAfter != RetryAfterFixed:
		panic("upstream: RetryAfterValue requires RetryAfter: RetryAfterFixed")
	case cfg.Limiter != nil && (cfg.Rate != 0 || cfg.PolicyWindow != 0):
		panic("upstream: Limiter excludes Rate and PolicyWindow")
	}
	return &Server{
		cfg:     cfg,
		start:   time.Now(),
		done:    make(chan struct{}),
		rate:    cfg.Rate,
		burst:   cfg.Burst,
		latency: cfg.Latency,
	}
}

func newTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		DialContext:         dial,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
	}
}

// URL returns the base URL of the server, without a trailing slash.
func (s *Server) URL() string { return s.hs.URL }

// Transport returns the transport that reaches this server; use it as
// sluice's base RoundTripper. For a [New] server every dial, whatever the
// address, reaches this server. Close closes its idle connections.
func (s *Server) Transport() *http.Transport { return s.tr }

// Client returns a new http.Client using [Server.Transport].
func (s *Server) Client() *http.Client { return &http.Client{Transport: s.tr} }

// StartTime returns the instant the server was created; quota windows are
// aligned to it.
func (s *Server) StartTime() time.Time { return s.start }

// Arrivals returns a copy of the requests seen so far, in arrival order.
// Requests still in the server have a zero Done.
func (s *Server) Arrivals() []Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Arrival(nil), s.arrivals...)
}

// Counts returns how many requests the limiters have accepted and refused.
func (s *Server) Counts() (accepted, rejected int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.rejected
}

// MaxInFlight returns the largest number of accepted requests that were in
// service at once (never more than MaxConcurrent when that is set).
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInService
}

// MaxOutstanding returns the largest number of accepted requests that were
// in the server at once, in service or queued for a MaxConcurrent slot:
// the concurrency the client actually imposed.
func (s *Server) MaxOutstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxOutstanding
}

// SetLatency replaces Config.Latency for requests accepted from now on.
// n keeps counting accepted requests since the server started.
func (s *Server) SetLatency(f func(n int, r *http.Request) time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = f
}

// SetRate replaces the GCRA parameters for requests arriving from now on.
// The theoretical arrival time is kept; rate 0 disables the limiter.
func (s *Server) SetRate(rate float64, burst int) {
	if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		panic(fmt.Sprintf("upstream: invalid rate %v", rate))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rate, s.burst = rate, burst
}

// Close shuts the server down: requests sleeping or queued in the server
// are abandoned (their clients see an error), and the listener, every
// connection and the idle connections of [Server.Transport] are closed,
// so that no goroutine started on the server's behalf survives (they may
// take a moment to exit in real time). Close is idempotent. For a [New]
// server used in a synctest bubble, Close must be called inside the
// bubble before the test function returns (t.Cleanup works).
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.tr.CloseIdleConnections()
		if s.ln != nil {
			s.ln.Close()
		}
		s.hs.Close()
		s.tr.CloseIdleConnections()
	})
}

// decision is the outcome of admitting one request.
type decision struct {
	ok        bool
	wait      time.Duration // until the next request would be accepted, when !ok
	policy    bool          // whether to send IETF RateLimit headers
	remaining int           // quota left in the window, after this request
	reset     time.Duration // until the quota window ends
}

// admitLocked applies GCRA and the quota window to a request arriving at
// now and, if both admit it, commits it. s.mu must be held.
func (s *Server) admitLocked(now time.Time) decision {
	d := decision{ok: true}

	var newTAT time.Time
	if s.rate > 0 {
		interval := time.Duration(float64(time.Second) / s.rate)
		if interval <= 0 {
			interval = 1
		}
		tolerance := time.Duration(max(s.burst, 1)-1) * interval
		tat := s.tat
		if tat.Before(now) {
			tat = now
		}
		if earliest := tat.Add(-tolerance); now.Before(earliest) {
			d.ok = false
			d.wait = earliest.Sub(now)
		} else {
			newTAT = tat.Add(interval)
		}
	}

	quota := max(s.cfg.Quota, 0)
	if w := s.cfg.PolicyWindow; w > 0 {
		idx := int64(now.Sub(s.start) / w)
		if idx != s.winIdx {
			s.winIdx, s.winCount = idx, 0
		}
		d.policy = true
		d.reset = s.start.Add(time.Duration(idx+1) * w).Sub(now)
		if s.winCount >= quota {
			d.ok = false
			d.wait = max(d.wait, d.reset)
		}
	}

	if d.ok {
		if s.rate > 0 {
			s.tat = newTAT
		}
		if d.policy {
			s.winCount++
		}
	}
	d.remaining = max(quota-s.winCount, 0)
	return d
}

// ServeHTTP implements the fake API: it admits or refuses r, records it,
// and for accepted requests waits for a concurrency slot and the latency
// before writing the response.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	now := time.Now()
	var d decision
	var ld Decision
	if s.cfg.Limiter != nil {
		ld = s.cfg.Limiter.Admit(now, r)
		d.ok = ld.Accepted
	} else {
		d = s.admitLocked(now)
	}
	idx := len(s.arrivals)
	a := Arrival{
		At:       now,
		Accepted: d.ok,
		Class:    r.Header.Get("X-Class"),
		Tenant:   r.Header.Get("X-Tenant"),
		Method:   r.Method,
		Path:     r.URL.Path,
	}
	var n int
	var latency func(int, *http.Request) time.Duration
	var tk ticket
	if d.ok {
		n = s.accepted
		s.accepted++
		latency = s.latency
		s.outstanding++
		s.maxOutstanding = max(s.maxOutstanding, s.outstanding)
		tk = s.enqueueLocked()
	} else {
		s.rejected++
		a.InFlight = s.inService
	}
	s.arrivals = append(s.arrivals, a)
	s.mu.Unlock()
	if d.ok {
		defer s.leave()
	}
	if ld.Done != nil {
		defer ld.Done()
	}

	body, err := io.ReadAll(r.Body)
	if err != nil {
		if d.ok {
			s.forfeit(tk)
		}
		s.abandon(idx)
	}
	sum := sha256.Sum256(body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.update(idx, func(a *Arrival) { a.BodyHash = hex.EncodeToString(sum[:]) })

	h := w.Header()
	if d.policy {
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%d`, max(s.cfg.Quota, 0), ceilSeconds(s.cfg.PolicyWindow)))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, d.remaining, ceilSeconds(d.reset)))
	}

	if s.cfg.Limiter != nil {
		maps.Copy(h, ld.Header)
		if !ld.Accepted {
			status, body := ld.Status, ld.Body
			if status == 0 {
				status = http.StatusTooManyRequests
			}
			if body == "" {
				body = "rate limited"
			}
			http.Error(w, body, status)
			s.finish(idx, status)
			return
		}
	} else if !d.ok {
		s.setRetryAfter(h, now, d.wait)
		http.Error(w, "rate limited", http.StatusTooManyRequests)
		s.finish(idx, http.StatusTooManyRequests)
		return
	}
	inFlight, ok := s.await(r.Context(), tk)
	if !ok {
		s.abandon(idx)
	}
	defer s.release()
	s.update(idx, func(a *Arrival) { a.Started, a.InFlight = time.Now(), inFlight })

	if latency != nil {
		if !s.sleep(r.Context(), latency(n, r)) {
			s.abandon(idx)
		}
	}

	rec := &statusRecorder{ResponseWriter: w}
	if s.cfg.Handler != nil {
		s.cfg.Handler(rec, r)
	} else {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(rec, "ok\n")
	}
	if rec.status == 0 {
		rec.status = http.StatusOK // net/http sends an implicit 200
	}
	s.finish(idx, rec.status)
}

func (s *Server) setRetryAfter(h http.Header, now time.Time, wait time.Duration) {
	switch s.cfg.RetryAfter {
	case RetryAfterSeconds:
		h.Set("Retry-After", strconv.FormatInt(max(ceilSeconds(wait), 1), 10))
	case RetryAfterFixed:
		h["Retry-After"] = []string{s.cfg.RetryAfterValue}
	case RetryAfterDate:
		at := now.Add(wait)
		if t := at.Truncate(time.Second); t.Before(at) {
			at = t.Add(time.Second)
		}
		h.Set("Retry-After", at.UTC().Format(http.TimeFormat))
	}
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// update applies f to the idx-th arrival under s.mu.
func (s *Server) update(idx int, f func(*Arrival)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.arrivals[idx])
}

// finish records the final status and completion time of the idx-th arrival.
func (s *Server) finish(idx, status int) {
	now := time.Now()
	s.update(idx, func(a *Arrival) { a.Status, a.Done = status, now })
}

// abandon records the idx-th arrival as abandoned (status 0) and aborts
// the handler, so that the client gets an error rather than the implicit
// empty 200 net/http would send if the handler just returned.
func (s *Server) abandon(idx int) {
	s.finish(idx, 0)
	panic(http.ErrAbortHandler)
}

// leave records that an accepted request has left the server.
func (s *Server) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outstanding--
}

// ticket is an accepted request's claim on a service slot: either a slot
// already held (n > 0, the number in service including it) or a place in
// the FIFO queue (ch).
type ticket struct {
	n  int
	ch chan int // receives the in-service count when the slot is handed over
}

// enqueueLocked claims a service slot for a request being admitted, or a
// place in the queue behind earlier requests when MaxConcurrent slots are
// busy. Claiming at admission keeps service order equal to arrival order.
// s.mu must be held.
func (s *Server) enqueueLocked() ticket {
	if k := s.cfg.MaxConcurrent; k <= 0 || (s.inService < k && len(s.waiters) == 0) {
		s.inService++
		s.maxInService = max(s.maxInService, s.inService)
		return ticket{n: s.inService}
	}
	ch := make(chan int, 1)
	s.waiters = append(s.waiters, ch)
	return ticket{ch: ch}
}

// await waits until tk holds a service slot and returns the number of
// requests in service including this one. If ctx ends or the server closes
// first, it gives up tk's place (or the slot, if it arrived meanwhile) and
// reports false.
func (s *Server) await(ctx context.Context, tk ticket) (inService int, ok bool) {
	if tk.ch == nil {
		return tk.n, true
	}
	select {
	case n := <-tk.ch:
		return n, true
	case <-ctx.Done():
	case <-s.done:
	}
	s.forfeit(tk)
	return 0, false
}

// forfeit gives up tk without being served: its place in the queue, or
// the slot it holds or has just been handed.
func (s *Server) forfeit(tk ticket) {
	if tk.ch != nil {
		s.mu.Lock()
		for i, w := range s.waiters {
			if w == tk.ch {
				s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
				s.mu.Unlock()
				return
			}
		}
		s.mu.Unlock()
		<-tk.ch // handed over concurrently: buffered, so already there
	}
	s.release()
}

// release gives up a service slot, handing it directly to the first
// queued request if there is one.
func (s *Server) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiters) > 0 {
		ch := s.waiters[0]
		s.waiters = s.waiters[1:]
		ch <- s.inService // buffered: never blocks
		return
	}
	s.inService--
}

// sleep waits for d on the (possibly virtual) clock. It reports false if
// ctx ended or the server closed first.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}

// statusRecorder remembers the final status written through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Flush implements [http.Flusher].
func (w *statusRecorder) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets [http.ResponseController] reach the underlying writer.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
