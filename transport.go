// Package sluice is an http.RoundTripper for calling APIs that publish a
// rate limit. It paces requests to the allowance, bounds what is in flight,
// serves interactive requests ahead of batch ones, and obeys what the server
// says about its limits.
//
//	tr, err := sluice.New(nil, sluice.WithRate(500, time.Minute))
//	if err != nil { ... }
//	client := &http.Client{Transport: tr}
//
// Each request draws on a lane, one per key (by default the URL's host). An
// attempt first waits for a token from the lane's token bucket, then for an
// in-flight slot; waiters are served by priority (see WithPriority), FIFO
// within a level. Within a level, tenants take turns (see WithTenant and
// WithTenantShare), so one caller's flood does not hold up the others.
//
// A lane learns from the server: Retry-After pauses it, 429s lower its pace
// and rate-limit headers set it. Processes that share an API key can share
// one budget through a Backend (see WithBackend and package sluiceredis).
package sluice

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Transport is an http.RoundTripper that paces and orders requests before
// handing them to a base RoundTripper. Create one with New; the zero value is
// not usable. A Transport is safe for concurrent use by multiple goroutines,
// and, like http.Transport, should be reused rather than created per request.
//
// A Transport starts no goroutine of its own: a lane runs one dispatcher
// goroutine only while requests are waiting in it.
type Transport struct {
	base http.RoundTripper
	cfg  config

	// lanes is a copy-on-write map: lookups, on every request, are an atomic
	// load and a map read; creating a lane, once per key, copies the map under
	// mu.
	lanes atomic.Pointer[map[string]*lane]
	mu    sync.Mutex
	// hot is the first lane created: most Transports call one host, and
	// comparing its key is cheaper than hashing it into lanes. It is never
	// moved, so requests to several hosts do not contend on it.
	hot atomic.Pointer[lane]
}

// New returns a Transport that sends requests through base, or through
// http.DefaultTransport if base is nil. It returns an error wrapping
// ErrInvalidOption that names the option and value if any option is invalid.
func New(base http.RoundTripper, opts ...Option) (*Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, cfg: defaultConfig()}
	for i, o := range opts {
		if o == nil {
			return nil, invalid("option %d is nil", i)
		}
		if err := o.apply(&t.cfg); err != nil {
			return nil, err
		}
	}
	if err := t.cfg.validate(); err != nil {
		return nil, err
	}
	m := make(map[string]*lane)
	t.lanes.Store(&m)
	return t, nil
}

// lane returns the lane for key, creating it on first use.
func (t *Transport) lane(key string) *lane {
	if l := t.hot.Load(); l != nil && l.key == key {
		return l
	}
	if l, ok := (*t.lanes.Load())[key]; ok {
		return l
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.lanes.Load()
	if l, ok := old[key]; ok {
		return l
	}
	m := make(map[string]*lane, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	l := newLane(key, &t.cfg)
	m[key] = l
	t.lanes.Store(&m)
	if len(old) == 0 {
		t.hot.Store(l)
	}
	return l
}

var (
	errNilRequest = errors.New("sluice: nil Request")
	errNilURL     = errors.New("sluice: nil Request.URL")
)

// RoundTrip sends req through the lane its key selects, once the lane grants
// it a token and an in-flight slot. It keeps the http.RoundTripper contract:
// req is not modified, its body is closed even on error, and a response comes
// with a nil error. An error is the context's error if the request was
// cancelled while waiting, a *RejectedError if it was refused because it
// could not be served in time, or the base transport's error.
//
// The in-flight slot is held until the response body is read to EOF or
// closed, so callers must close response bodies, as net/http requires.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, errNilRequest
	}
	if req.URL == nil {
		closeBody(req)
		return nil, errNilURL
	}
	l := t.lane(t.cfg.key(req))
	p := PriorityFrom(req.Context())
	return t.do(l, req, p)
}

// attempt makes one attempt of req through l: it waits for a grant, sends,
// reads what the response says about limits, and wraps the response body so
// that the slot is released when it is done. enq is the first attempt's
// enqueue time on the lane's clock (firstAttempt for a first attempt);
// attempt returns it for the next.
func (t *Transport) attempt(l *lane, req *http.Request, p Priority, enq time.Duration) (*http.Response, time.Duration, error) {
	ctx := req.Context()
	g, err := l.acquire(ctx, p, enq)
	enq, start := g.enq, g.start
	if err != nil {
		closeBody(req)
		return nil, enq, err
	}
	if err := ctx.Err(); err != nil {
		// Cancelled between grant and send: nothing was sent, so the token
		// and the slot go back.
		l.refund(g.tn, g.ch)
		closeBody(req)
		return nil, enq, err
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		l.release(start, g.tn, 0, g.timed)
		return nil, enq, err
	}
	// status is what the lane learns from when the attempt is done: a
	// refusal for the rate in another form (GitHub's 403) counts as a 429,
	// neither accepted nor a latency sample.
	status := resp.StatusCode
	if signals(resp) {
		if l.observe(resp, l.timeOf(start), p, g.ch) {
			status = http.StatusTooManyRequests
		}
		if l.be != nil {
			l.shareCooldown()
		}
	}
	// A protocol switch keeps the connection for as long as it lives; it is
	// not a request in flight, and its body must stay writable.
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody {
		l.release(start, g.tn, status, g.timed)
		return resp, enq, nil
	}
	resp.Body = &body{rc: resp.Body, l: l, start: start, tn: g.tn, status: status, timed: g.timed}
	return resp, enq, nil
}

// fanoutLimit is how many attempts the Transport lets be in flight now: the
// sum of its lanes' in-flight limits, or the configured minimum before any
// lane exists. ForEach reads it to bound its goroutines.
func (t *Transport) fanoutLimit() int {
	n := 0
	for _, l := range *t.lanes.Load() {
		l.mu.Lock()
		n += l.slot.limit
		l.mu.Unlock()
	}
	if n == 0 {
		return t.cfg.minConc
	}
	return n
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// body releases its attempt's slot when it is read to EOF or closed,
// whichever comes first.
type body struct {
	rc     io.ReadCloser
	l      *lane
	start  time.Duration // on the lane's clock
	tn     *tenant
	status int
	timed  bool
	done   atomic.Bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *body) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

func (b *body) finish() {
	if b.done.CompareAndSwap(false, true) {
		b.l.release(b.start, b.tn, b.status, b.timed)
	}
}
