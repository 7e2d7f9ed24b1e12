package sluice

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/verdict"
)

// Transport is an http.RoundTripper that paces and orders requests before
// handing them to a base RoundTripper. Create one with New; the zero value is
// not usable. A Transport is safe for concurrent use by multiple goroutines,
// and, like http.Transport, should be reused rather than created per request.
//
// An idle Transport runs no goroutine: a lane runs a dispatcher only while
// requests wait in it, events are delivered on a goroutine only while some
// are pending, and the sweep of idle lanes runs on a timer only while
// lanes exist.
type Transport struct {
	base http.RoundTripper // nil: http.DefaultTransport, read at each request
	cfg  config

	// lanes maps a key to its lane (*lane). A lookup, on every request, reads
	// it without a lock; creating a lane, once per key, costs O(1)
	// amortised whatever the number of lanes (sync.Map is a concurrent hash
	// trie), and so does forgetting one. nLanes counts its entries.
	lanes  sync.Map
	nLanes atomic.Int64
	// hot is the first live lane created: most Transports call one host,
	// and comparing its key is cheaper than hashing it into lanes. It is not
	// moved while it lives, so requests to several hosts do not contend on
	// it; when it is forgotten, the next lane created takes its place.
	hot atomic.Pointer[lane]

	// The sweep that forgets idle lanes (see WithLaneIdle): a timer armed
	// while the Transport has lanes, every laneIdle/2. armed says it is
	// armed or running; sweepMu guards sweeper.
	armed   atomic.Bool
	sweepMu sync.Mutex
	sweeper *time.Timer

	closed atomic.Bool   // see Close
	done   chan struct{} // closed by Close: what waits outside a lane's queue stops

	// The last sum of the lanes' limits (see fanoutLimit), and until when
	// it is used, in nanoseconds since monoEpoch; 0: none yet.
	fanSum, fanAt atomic.Int64

	// Sub-limits (see sublimit.go): subCfg is the options of their lanes,
	// subRated those of the sub-limits given a rate (WithSublimitRate), by
	// name; routes maps a host's key to its *routes, made when a response first
	// names a limit or a caller a sub-limit, which sets learned.
	subCfg   config
	subRated map[string]*config
	routes   sync.Map
	learned  atomic.Bool
}

// New returns a Transport that sends requests through base, or, if base is
// nil, through http.DefaultTransport as it is when each request is sent (as
// http.Client does with a nil Transport). It returns an error wrapping
// ErrInvalidOption that names the option and value if any option is invalid.
func New(base http.RoundTripper, opts ...Option) (*Transport, error) {
	t := &Transport{base: base, cfg: defaultConfig(), done: make(chan struct{})}
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
	t.cfg.events = newEvents(t.cfg.observers, t.cfg.logger)
	t.subCfg = t.cfg.sublimit()
	if len(t.cfg.subRates) > 0 {
		t.subRated = make(map[string]*config, len(t.cfg.subRates))
	}
	for name, r := range t.cfg.subRates {
		// A sub-limit given a rate is a budget as a lane's is: a Backend
		// shares it across processes. Others pace by their responses.
		c := t.subCfg
		c.rateN, c.ratePer, c.backend = r.n, r.per, t.cfg.backend
		t.subRated[name] = &c
	}
	return t, nil
}

// keyOf returns the key of req's lane (see WithKey). A key never holds
// subSep, which joins a host's key and a sub-limit's name: such a key
// would be that sub-limit's lane, which has no rate of its own. It is
// replaced, so that keys which differ only there share a lane.
func (t *Transport) keyOf(req *http.Request) string {
	k := t.cfg.key(req)
	if strings.IndexByte(k, subSep[0]) >= 0 {
		k = strings.ReplaceAll(k, subSep, "\uFFFD")
	}
	return k
}

// laneOf returns the lane of req's key (see keyOf), creating it on first
// use, as lane does. The hot lane is matched before the key is cleaned: a
// key that holds subSep never equals the hot lane's, which holds none.
func (t *Transport) laneOf(req *http.Request) *lane {
	if l, k := t.hot.Load(), t.cfg.key(req); l != nil && l.key == k {
		return l
	}
	return t.lane(t.keyOf(req))
}

// baseRT returns the RoundTripper attempts are sent through.
func (t *Transport) baseRT() http.RoundTripper {
	if t.base != nil {
		return t.base
	}
	return http.DefaultTransport
}

// CloseIdleConnections closes the base's idle connections, if the base has a
// CloseIdleConnections method (as *http.Transport does); http.Client's
// CloseIdleConnections calls it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.baseRT().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// lane returns the lane for key, creating it on first use. The lane it
// returns may be forgotten at any moment after (see WithLaneIdle); its
// acquire then fails with errLaneGone, and the caller asks relane for the
// key's live lane.
func (t *Transport) lane(key string) *lane {
	if l := t.hot.Load(); l != nil && l.key == key {
		return l
	}
	if v, ok := t.lanes.Load(key); ok {
		if l := v.(*lane); !l.isDead() {
			return l
		}
	}
	return t.laneSlow(key, &t.cfg)
}

// relane returns the live lane of a lane that acquire found forgotten.
func (t *Transport) relane(dead *lane) *lane {
	t.hot.CompareAndSwap(dead, nil)
	return t.laneSlow(dead.key, dead.cfg)
}

// relaneAt is relane, and at, a reading of the forgotten lane's clock, on
// the live lane's: each lane counts from its creation.
func (t *Transport) relaneAt(dead *lane, at time.Duration) (*lane, time.Duration) {
	l := t.relane(dead)
	return l, l.clk.ticks(dead.clk.timeOf(at))
}

// laneSlow returns the live lane for key, with the options cfg, creating
// it if there is none, or only a forgotten one not yet removed from the
// map.
func (t *Transport) laneSlow(key string, cfg *config) *lane {
	for {
		v, ok := t.lanes.Load(key)
		if ok {
			old := v.(*lane)
			if !old.isDead() {
				return old
			}
			l := newLane(key, cfg)
			if t.lanes.CompareAndSwap(key, old, l) {
				t.added(l)
				return l
			}
			continue
		}
		l := newLane(key, cfg)
		if _, loaded := t.lanes.LoadOrStore(key, l); !loaded {
			t.nLanes.Add(1)
			t.added(l)
			return l
		}
	}
}

// added finishes the creation of l, now in the map: it may become the hot
// lane, it is closed at once if Close has run meanwhile (Close sets closed
// before it visits the map, so one of the two sees the other), and the
// sweep is armed if it is not.
func (t *Transport) added(l *lane) {
	if !l.cfg.sub {
		t.hot.CompareAndSwap(nil, l)
	}
	if t.closed.Load() {
		l.close()
	}
	t.armSweep()
}

// find returns the live lane for key, or nil: it creates none.
func (t *Transport) find(key string) *lane {
	if v, ok := t.lanes.Load(key); ok {
		if l := v.(*lane); !l.isDead() {
			return l
		}
	}
	return nil
}

// armSweep arms the sweep of idle lanes if it is not armed, lanes are
// forgotten (WithLaneIdle is not 0) and the Transport is open.
func (t *Transport) armSweep() {
	if t.cfg.laneIdle == 0 || t.armed.Load() || !t.armed.CompareAndSwap(false, true) {
		return
	}
	t.sweepMu.Lock()
	defer t.sweepMu.Unlock()
	if t.closed.Load() {
		return // Close stopped the sweep for good; armed stays set
	}
	// At least minSweepEvery apart: a sweep every laneIdle/2 of
	// WithLaneIdle(time.Nanosecond) would spin a core for as long as a
	// lane is not idle (its bucket refilling, a cooldown).
	d := max(t.cfg.laneIdle/2, minSweepEvery)
	if t.sweeper == nil {
		t.sweeper = time.AfterFunc(d, t.sweep)
	} else {
		t.sweeper.Reset(d)
	}
}

// sweep forgets every lane idle for laneIdle or more (see lane.forget),
// then arms itself again if lanes remain. It visits each lane once, taking
// its lock briefly, and holds no lock of the Transport: requests and lane
// creation go on meanwhile.
func (t *Transport) sweep() {
	t.lanes.Range(func(k, v any) bool {
		l := v.(*lane)
		if l.forget(t.cfg.laneIdle) {
			if t.lanes.CompareAndDelete(k, l) {
				t.nLanes.Add(-1)
			}
			t.hot.CompareAndSwap(l, nil)
		}
		return true
	})
	if t.learned.Load() {
		now := time.Now()
		t.routes.Range(func(k, v any) bool {
			host := k.(string)
			alive := func(name string) bool { return t.find(host+subSep+name) != nil }
			if v.(*routes).forget(now, t.cfg.laneIdle, alive) {
				t.routes.CompareAndDelete(k, v)
			}
			return true
		})
	}
	// A lane created from here on arms the sweep itself; one created
	// before is counted in nLanes.
	t.armed.Store(false)
	if t.nLanes.Load() > 0 {
		t.armSweep()
	}
}

// minSweepEvery is the shortest time between two sweeps (see armSweep).
const minSweepEvery = 10 * time.Millisecond

var (
	errNilRequest = errors.New("sluice: nil Request")
	errNilURL     = errors.New("sluice: nil Request.URL")
	// errLaneGone is what acquire returns on a lane that was forgotten
	// (see WithLaneIdle): the caller takes the key's live lane and tries
	// again. It never reaches a caller of RoundTrip.
	errLaneGone = errors.New("sluice: lane forgotten")
	// errNilResponse is what a base that returns neither a response nor an
	// error becomes, as http.Client does. It is not retried.
	errNilResponse = errors.New("sluice: RoundTripper returned a nil *Response with a nil error")
)

// RoundTrip sends req through the lane its key selects, once the lane grants
// it a token and an in-flight slot. It keeps the http.RoundTripper contract:
// req is not modified, its body is closed even on error, and a response comes
// with a nil error. An error is the context's error if the request was
// cancelled while waiting, a *RejectedError if it was refused because it
// could not be served in time, or the base transport's error.
//
// The in-flight slot is held until the response body is read to EOF, fails
// a read or is closed; callers must close response bodies, as net/http
// requires. A response whose request's context ends first gives its slot
// back once the slot is wanted: at once if a request waits for one, else
// when the lane next reports its state (Stats) or is forgotten. As a last
// resort, a body that is dropped unclosed gives its slot back when the
// garbage collector finds it unreachable, and the lane logs a warning
// (once) naming the cause.
//
// A base that returns a nil response and a nil error gives its slot back and
// becomes an error. A base that panics gives its slot back, and the panic
// goes on to the caller: like http.Client, sluice does not recover panics.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, errNilRequest
	}
	if req.URL == nil {
		closeBody(req)
		return nil, errNilURL
	}
	if t.closed.Load() {
		closeBody(req)
		return nil, ErrClosed
	}
	l := t.laneOf(req)
	lb := labelsOf(req.Context())
	return t.do(l, req, lb.priority(), lb.tenant)
}

// attempt makes one attempt of req through l: it waits for a grant, sends,
// reads what the response says about limits, and wraps the response body so
// that the slot is released when it is done. enq is the first attempt's
// enqueue time on the lane's clock (firstAttempt for a first attempt);
// attempt returns it for the next. unread: the response names a limit that
// no lane reads (see named), so that no lane paused for its refusal.
func (t *Transport) attempt(l *lane, req *http.Request, p Priority, id string, enq time.Duration, n int) (resp *http.Response, _ time.Duration, unread bool, err error) {
	ctx := req.Context()
	var s *hold // the attempt's hold on its sub-limit, if it draws on one
	var caller, fallback bool
	if t.learned.Load() || sublimitsNamed.Load() || t.cfg.sublimitKey != nil {
		var sub *lane
		var err error
		if s, caller, fallback, sub, err = t.acquireSub(ctx, l, req, p, id, enq); err != nil {
			t.refused(ctx, sub, p, n, err)
			closeBody(req)
			return nil, enq, false, err
		}
	}
	var h *hold
	if s == nil && enq == firstAttempt && l.fast.Load()&fastMask != 0 {
		h = l.takePrepaid(ctx, p, id) // acquire's first step, without its frame
	}
	if h != nil {
		enq = h.at
	} else if h, enq, err = l.acquire(ctx, p, id, hostEnq(l, s, enq), enq == firstAttempt, s != nil && caller, 0); err != nil {
		if s != nil {
			s.Drop()
		}
		if err != errLaneGone { // nothing was taken; do tries the live lane
			t.refused(ctx, l, p, n, err)
			closeBody(req)
		}
		return nil, enq, false, err
	}
	if ev := t.cfg.events; ev != nil {
		ev.pushRequest(ctx, EventGranted, l, h.at, p, h.tn.id, n, h.wait)
	}
	if err := ctx.Err(); err != nil {
		// Cancelled between grant and send: nothing was sent, so the token
		// and the slot go back.
		h.Drop()
		if s != nil {
			s.Drop()
		}
		closeBody(req)
		return nil, enq, false, err
	}
	if n > 1 {
		l.countRetry()
	}
	resp, err = t.send(l, req, h, s)
	if err != nil || resp == nil {
		l.dropCharge(h.ch)
		h.Done(verdict.Failed)
		if s != nil {
			s.l.dropCharge(s.ch)
			s.Done(verdict.Failed)
		}
		if err == nil {
			err = errNilResponse
		}
		return nil, enq, false, err
	}
	var on *lane // the lane that read the response, nil if none did
	var sent time.Duration
	if s == nil && h.ch == nil && !h.look && !speaks(resp) {
		h.kind, on, sent = verdict.Of(resp.StatusCode), l, h.at // what read finds, without its frame
	} else {
		h.kind, on, sent = t.read(ctx, l, req, resp, p, h, s, caller, fallback)
	}
	// A stream whose first event is looked at (see frameWatch) may yet
	// be refused by it: a sub-limit's pace hears of it then.
	stream := isStream(resp)
	watched := stream && h.kind == verdict.Served && on != nil
	var sub *lane // the sub-limit whose pace hears of the first event
	var subSent time.Duration
	if s != nil {
		// The sub-limit bounds no slots: its hold ends with the headers.
		// Watched, it is given back as no answer yet, which its pace
		// counts neither way.
		k := h.kind
		if watched {
			k, sub, subSent = verdict.Failed, s.l, s.at
		}
		s.Done(k)
	}
	// A protocol switch keeps the connection for as long as it lives; it is
	// not a request in flight, and its body must stay writable. A stream
	// (see HoldStream) is done with the server's work when its first event
	// comes: its slot goes back, and its latency is the time to it.
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody {
		h.Done(h.kind)
		return resp, enq, on == nil, nil
	}
	var fw *frameWatch
	held := true // the slot goes back when the body is done
	if stream {
		// A stream's first event may be an error the headers did not say.
		if watched {
			fw = &frameWatch{rc: resp.Body, t: t, l: on, ctx: ctx, p: p, sent: sent, host: l, hostSent: h.at,
				sub: sub, subSent: subSent}
			resp.Body = fw
		}
		if held = holdsStream(ctx); !held && fw == nil {
			h.Done(h.kind)
			return resp, enq, on == nil, nil
		}
	}
	b := wrap(resp.Body, h)
	if fw != nil {
		// It goes back at the first event, as what the event says, or,
		// held and served, when the body is done.
		fw.slot, fw.held = b, held
	}
	resp.Body = b
	return resp, enq, on == nil, nil
}

// hostEnq returns the enqueue time on host lane l of an attempt whose
// first attempt was enqueued at enq (firstAttempt: this one), and that
// drew on a sub-limit with hold s (nil: none): a first attempt that waited
// in its sub-limit's queue (for the host's cooldown, or the sub-limit's
// pace) keeps its place at the host by when it came, as a retry does.
func hostEnq(l *lane, s *hold, enq time.Duration) time.Duration {
	if enq != firstAttempt || s == nil || s.wait <= 0 {
		return enq
	}
	return max(l.clk.ticks(s.l.clk.timeOf(s.at-s.wait)), 0)
}

// acquireSub takes req's token on the sub-limit it draws on besides l, if
// any (see sublimitOf), and returns its hold, whether the caller named the
// sub-limit, whether it is the host's fallback, and the sub-limit's lane.
// enq is the first attempt's enqueue time on l's clock, or firstAttempt: a
// retry keeps its place on the sub-limit too.
func (t *Transport) acquireSub(ctx context.Context, l *lane, req *http.Request, p Priority, id string, enq time.Duration) (s *hold, caller, fallback bool, sub *lane, err error) {
	sub, caller, fallback = t.sublimitOf(l, req)
	if sub == nil {
		return nil, false, false, nil, nil
	}
	// A token the sub-limit grants while the host cools down would be
	// sent with every other one the sub-limit granted meanwhile, at once,
	// when the host opens: the sub-limit's pace begins after the cooldown.
	// Its waiters wait for the host in its queue, so that they are granted
	// in priority order when the host opens.
	var after time.Duration // the host's wait, which a deadline refusal counts too
	if _, ok := ctx.Deadline(); ok || t.cfg.maxWait[p] > 0 {
		after = l.waitEstimate(p, id, enq)
	}
	var held, kept time.Time // the host's cooldown end the sub-limit was held to; the first enqueue
	for {
		if until, ok := l.coolEnd(ctx, t.cfg.maxWait[p]); ok {
			sub.holdTo(until)
			held = until
		}
		subEnq := firstAttempt
		if enq != firstAttempt {
			subEnq = max(sub.clk.ticks(l.clk.timeOf(enq)), 0)
		} else if !kept.IsZero() {
			subEnq = max(sub.clk.ticks(kept), 0)
		}
		var at time.Duration
		s, at, err = sub.acquire(ctx, p, id, subEnq, enq == firstAttempt, !caller, after)
		if err == errLaneGone {
			sub = t.relane(sub)
			continue
		}
		if err != nil {
			return s, caller, fallback, sub, err
		}
		if !kept.IsZero() {
			// It queued from when it first came (see hostEnq), its place
			// kept across the grants it gave back.
			s.wait = s.at - at
		}
		// A cooldown of the host that began or grew while the request
		// waited here: the grant goes back, and the request waits for
		// the host in the queue, keeping its place. A grant that waited
		// for nothing came just after the look above.
		if s.wait == 0 {
			return s, caller, fallback, sub, nil
		}
		if until, ok := l.coolEnd(ctx, t.cfg.maxWait[p]); ok && until.After(held) {
			s.Drop()
			held, kept = until, sub.clk.timeOf(at)
			continue
		}
		return s, caller, fallback, sub, nil
	}
}

// refused reports an attempt that acquire refused or failed.
func (t *Transport) refused(ctx context.Context, l *lane, p Priority, n int, err error) {
	rej, ok := err.(*RejectedError)
	if !ok {
		return
	}
	t.logRefusal(ctx, rej)
	if ev := t.cfg.events; ev != nil {
		ev.push(ctx, &Event{Kind: EventRefused, Lane: l.key, Priority: p, Tenant: rej.Tenant, Attempt: n,
			Reason: rej.Reason, Err: rej, Wait: rej.Wait})
	}
}

// read passes what resp says about limits to l, or to the sub-limit it
// names, and returns what the attempt was to the server (see verdict),
// which the lane learns from when the attempt is done, with the lane that
// read it (nil if none did) and when the attempt was sent on that lane's
// clock. s is the attempt's hold on a sub-limit, nil if none; caller: the
// caller named it; fallback: it is the host's fallback, and req's route is
// filed nowhere.
func (t *Transport) read(ctx context.Context, l *lane, req *http.Request, resp *http.Response, p Priority, h, s *hold, caller, fallback bool) (verdict.Kind, *lane, time.Duration) {
	// A refusal's, a 403's or a GraphQL answer's body may say what its
	// status and headers do not (see verdict.Body); other bodies are not
	// looked at.
	var body verdict.Signal
	if looksAt(resp) {
		var prefix []byte
		prefix, resp.Body = peek(resp.Body)
		body = verdict.Body(prefix)
		if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusTooManyRequests {
			// GitHub states its secondary limit in a 403's or a 429's
			// body only: a GraphQL answer's data may quote its words.
			body.Secondary = false
		}
	}
	if !body.Throttles() && !body.Points.Stated && !l.reads(resp, h.look) {
		if h.look && t.learned.Load() {
			// Its headers were looked at and hold no rate-limit field:
			// it names no limit (see routes.fallback).
			if rs := t.routesOf(l.key, false); rs != nil {
				rs.sawUnnamed(time.Now())
			}
		}
		l.dropCharge(h.ch)
		if s != nil {
			s.l.dropCharge(s.ch)
		}
		if s != nil && caller {
			return verdict.Of(resp.StatusCode), s.l, s.at
		}
		return verdict.Of(resp.StatusCode), l, h.at
	}
	// Which limit the response speaks of: the one it names, else the
	// caller's, else the host's. A global refusal is the host's, and so is
	// one that the limit it names did not make (see hostRefusal), without
	// that limit's quota.
	on, quota := l, true
	name, bucket, global := headers.LimitName(resp.Header)
	if name == "" && t.learned.Load() {
		if rs := t.routesOf(l.key, false); rs != nil {
			rs.sawUnnamed(time.Now())
		}
	}
	// An overload is of the server's capacity, which the host's in-flight
	// limit bounds: a sub-limit has none to cut, and would pause instead.
	overload := verdict.Of(resp.StatusCode) == verdict.Overloaded
	if overload {
		_, hasRA := headers.RetryAfter(resp.Header, time.Now(), t.cfg.maxRetryAfter)
		overload = !hasRA // else it asks for a pause
	}
	switch {
	case overload && (name != "" || caller):
		quota = false // the sub-limit's, not the host's
	case name != "" && hostRefusal(resp, body):
		quota = false
	case name != "":
		var filedAs *lane // the sub-limit the route was found filed under
		if s != nil && !caller && !fallback {
			filedAs = s.l
		}
		on = t.named(l, req, name, bucket, filedAs) // nil: past maxSublimits
		if testHookNamed != nil {
			testHookNamed(on)
		}
	case caller && !global:
		on = s.l
	}
	// The attempt's costs were drawn on the caller's sub-limit, if it has
	// one, else on the host; a lane that did not draw them reads no
	// budget's count from the response.
	chl, ch := l, h.ch
	if s != nil && caller {
		chl, ch = s.l, s.ch
	}
	if on != chl {
		chl.dropCharge(ch)
		ch = nil
	}
	if on == nil {
		return verdict.Of(resp.StatusCode), nil, 0
	}
	sent := h.at
	switch {
	case on == l:
	case s != nil && on == s.l:
		sent = s.at
	default:
		sent = on.clk.ticks(l.clk.timeOf(h.at))
	}
	k, live := on.observe(ctx, resp, sent, p, ch, body, quota)
	for !live {
		// A lane the response named, on which the attempt holds nothing
		// (a held lane is not forgotten), was forgotten since it was
		// found: what the response says goes to the live one.
		on, sent = t.relaneAt(on, sent)
		k, live = on.observe(ctx, resp, sent, p, nil, body, quota)
	}
	if on == l && l.be() != nil {
		l.shareCooldown()
	}
	return k, on, sent
}

// testHookNamed, set only by tests, sees the lane a response names, once
// it is found and before it reads the response.
var testHookNamed func(*lane)

// hostRefusal reports a refusal of the host by a response that names a
// limit that did not make it: a 429, or a 403 with Retry-After or a
// throttle in its body (GitHub's secondary limits), while the named limit
// has requests left. A 403 that is no rate limit (a permission error)
// carries its limit's quota too, and is the named limit's to read; so is a
// refusal that Discord scopes to the caller or to a shared resource
// (X-RateLimit-Scope "user" or "shared").
func hostRefusal(resp *http.Response, body verdict.Signal) bool {
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
	case http.StatusForbidden:
		if _, ok := resp.Header["Retry-After"]; !ok && !body.Throttles() {
			return false
		}
	default:
		return false
	}
	if headers.Scoped(resp.Header) {
		return false
	}
	q, ok := headers.Parse(resp.Header, time.Now())
	return ok && q.Remaining > 0
}

// send hands req to the base, with a trace of its write if the lane wants
// it (see lane.traceWrite). If the base panics, the attempt's slot is given
// back and the panic goes on: nothing is recovered.
func (t *Transport) send(l *lane, req *http.Request, h, s *hold) (*http.Response, error) {
	sent := req
	if h.spaced {
		sent = l.traceWrite(req, h.at)
	}
	returned := false
	defer func() {
		if !returned {
			// Nothing will answer the charges: the server may or may not
			// have counted them, as for a transport error.
			l.dropCharge(h.ch)
			if s != nil {
				s.l.dropCharge(s.ch)
			}
			h.finish(verdict.Failed, false)
			if s != nil {
				s.finish(verdict.Failed, false)
			}
		}
	}()
	resp, err := t.baseRT().RoundTrip(sent)
	returned = true
	if sent != req && resp != nil && resp.Request == sent {
		resp.Request = req // the caller's, not the traced copy
	}
	return resp, err
}

// logRefusal logs an admission refusal at Info, with the request's context.
func (t *Transport) logRefusal(ctx context.Context, rej *RejectedError) {
	if lg := t.cfg.logger; lg.Enabled(ctx, slog.LevelInfo) {
		lg.InfoContext(ctx, "sluice: request refused", "lane", rej.Key, "sublimit", rej.Sublimit, "priority", rej.Priority,
			"reason", rej.Reason, "wait", rej.Wait, "retry_after", rej.RetryAfter)
	}
}

const (
	// fanoutLanes is the most lanes whose limits fanoutLimit sums at each
	// call; over a Transport of more, it sums them at most every
	// fanoutEvery, or ten times as long as the last sum took.
	fanoutLanes = 64
	fanoutEvery = 5 * time.Millisecond
)

// fanoutLimit is how many attempts the Transport lets be in flight now: the
// sum of its lanes' in-flight limits, or the configured minimum before any
// lane exists. ForEach reads it to bound its goroutines, before each item.
// Over more than fanoutLanes lanes the sum is at most fanoutEvery old (or
// ten times what it took), so that a ForEach over a Transport of a million
// lanes does not visit each at every item.
func (t *Transport) fanoutLimit() int {
	if t.nLanes.Load() <= fanoutLanes {
		return t.sumLimits()
	}
	// On the monotonic clock: a wall clock stepped back would keep an
	// old sum for as long as the step.
	start := time.Since(monoEpoch)
	if next := t.fanAt.Load(); next != 0 && int64(start) < next {
		return int(t.fanSum.Load())
	}
	n := t.sumLimits()
	took := time.Since(monoEpoch) - start
	t.fanSum.Store(int64(n))
	t.fanAt.Store(int64(start + max(fanoutEvery, 10*took)))
	return n
}

// monoEpoch is the origin of readings of the monotonic clock kept as
// integers (see fanoutLimit).
var monoEpoch = time.Now()

// testHookSum, if set, is called at each sum of the lanes' limits.
var testHookSum func()

// sumLimits is fanoutLimit's sum, made now.
func (t *Transport) sumLimits() int {
	if testHookSum != nil {
		testHookSum()
	}
	n, seen := 0, false
	t.lanes.Range(func(_, v any) bool {
		l := v.(*lane)
		if l.cfg.sub {
			return true // its host's limit bounds it
		}
		seen = true
		l.lock()
		// What the lane can have in flight: its limit, or less under a
		// Leaser's cap on the fleet's attempts (see limiter.free).
		c := l.slot.limit
		if l.slot.leased > 0 {
			c = min(c, l.slot.leased-1)
		}
		// Held within the range of an int32 with room for the lookahead:
		// limits of WithConcurrency(1, math.MaxInt) would overflow the sum.
		n += min(c, math.MaxInt32-ForEachLookahead-n)
		l.unlock()
		return true
	})
	if !seen {
		// As the lanes' sum is: WithConcurrency(math.MaxInt, ...) would
		// overflow ForEach's bound.
		return min(t.cfg.minConc, math.MaxInt32-ForEachLookahead)
	}
	return n
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
