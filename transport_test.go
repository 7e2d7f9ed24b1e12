package sluice

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// trackBody records whether it was closed.
type trackBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackBody) Close() error { b.closed.Store(true); return nil }

func TestRoundTripNilRequest(t *testing.T) {
	tr := mustNew(t, &fakeBase{})
	if _, err := tr.RoundTrip(nil); err == nil || !strings.HasPrefix(err.Error(), "sluice: ") {
		t.Errorf("nil request: err = %v", err)
	}
	b := &trackBody{Reader: strings.NewReader("x")}
	if _, err := tr.RoundTrip(&http.Request{Method: "POST", Body: b}); err == nil {
		t.Error("nil URL: no error")
	}
	if !b.closed.Load() {
		t.Error("nil URL: body not closed")
	}
}

func TestRoundTripDoesNotMutateRequest(t *testing.T) {
	tr := mustNew(t, &fakeBase{}, WithRate(100, time.Second))
	req, _ := http.NewRequest("GET", "http://api.test/a?b=c", nil)
	req.Header.Set("X-Test", "1")
	before := *req
	hdr := req.Header.Clone()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.URL != before.URL || req.Body != before.Body || req.Host != before.Host || req.Method != before.Method {
		t.Error("request fields changed")
	}
	if len(req.Header) != len(hdr) || req.Header.Get("X-Test") != "1" {
		t.Errorf("headers changed: %v", req.Header)
	}
}

func TestRoundTripClosesBodyWhenRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(1, time.Second), WithMaxWait(Normal, 100*time.Millisecond))
		if err := get(t.Context(), tr, ""); err != nil { // takes the only token
			t.Fatal(err)
		}
		b := &trackBody{Reader: strings.NewReader("payload")}
		req, _ := http.NewRequest("POST", "http://api.test/x", b)
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, ErrRejected) {
			t.Fatalf("err = %v, want ErrRejected", err)
		}
		if !b.closed.Load() {
			t.Error("request body not closed on refusal")
		}
	})
}

// TestPacing: requests arrive at the base exactly one interval apart, and a
// caller waiting for the clock holds no slot.
func TestPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(10, time.Second))
		start := time.Now()
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if err := get(t.Context(), tr, ""); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 || s.Levels[Normal].Queued != 19 {
			t.Errorf("while waiting for the clock: in flight %d (want 0), queued %d (want 19)", s.InFlight, s.Levels[Normal].Queued)
		}
		wg.Wait()
		ts := base.times()
		for i, at := range ts {
			if want := time.Duration(i) * 100 * time.Millisecond; at.Sub(start) != want {
				t.Errorf("request %d arrived at %v, want %v", i, at.Sub(start), want)
			}
		}
	})
}

// TestNeverOverRate hammers one lane from thousands of goroutines that
// arrive at random moments, and checks that the base never sees more than
// rate x T + burst requests in any window T.
func TestNeverOverRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			perSec  = 200
			burst   = 5
			callers = 3000
		)
		base := &fakeBase{latency: 3 * time.Millisecond}
		tr := mustNew(t, base, WithRate(perSec, time.Second), WithBurst(burst))
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				// Spread arrivals over about 10 s with gaps, so the bucket
				// refills and bursts are exercised too.
				time.Sleep(time.Duration((i*7919)%10000) * time.Millisecond)
				ctx := t.Context()
				if i%10 == 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%97)*time.Millisecond)
					defer cancel()
				}
				get(WithPriority(ctx, Priority(i%3)), tr, "")
			})
		}
		wg.Wait()
		ts := base.times()
		if len(ts) < callers*8/10 {
			t.Fatalf("only %d of %d requests sent", len(ts), callers)
		}
		for _, w := range []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second, 5 * time.Second} {
			limit := int(perSec*w.Seconds()) + burst
			// w+1: a closed window of length w, both ends included.
			if got := upstream.MaxInWindow(ts, w+1); got > limit {
				t.Errorf("window %v: %d requests, limit %d", w, got, limit)
			}
		}
		s, _ := tr.Stats().Lane("api.test")
		if s.InFlight != 0 {
			t.Errorf("in flight after all done: %d", s.InFlight)
		}
	})
}

// TestSlotHeldUntilBodyDone: the in-flight limit counts attempts whose body
// is not yet read to EOF or closed.
func TestSlotHeldUntilBodyDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithConcurrency(2, 2))
		var resps []*http.Response
		for range 2 {
			req, _ := http.NewRequest("GET", "http://api.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resps = append(resps, resp)
		}
		third := make(chan error)
		go func() { third <- get(t.Context(), tr, "") }()
		synctest.Wait()
		select {
		case err := <-third:
			t.Fatalf("third request finished while two bodies were open: %v", err)
		default:
		}
		io.ReadAll(resps[0].Body) // EOF releases the slot
		if err := <-third; err != nil {
			t.Fatal(err)
		}
		resps[1].Body.Close()
		resps[0].Body.Close() // a second release must not free another slot
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 || s.Limit != 2 {
			t.Errorf("in flight %d limit %d, want 0 and 2", s.InFlight, s.Limit)
		}
	})
}

// TestBaseErrorReleasesSlot: a failed attempt does not keep its slot.
func TestBaseErrorReleasesSlot(t *testing.T) {
	fail := errors.New("boom")
	tr := mustNew(t, rtFunc(func(*http.Request) (*http.Response, error) { return nil, fail }), WithConcurrency(1, 1), WithRetry(0))
	for range 3 {
		if err := get(context.Background(), tr, ""); !errors.Is(err, fail) {
			t.Fatalf("err = %v, want %v", err, fail)
		}
	}
	if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
		t.Errorf("in flight = %d", s.InFlight)
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCancelWhileQueued: a waiter whose context ends leaves at once with the
// context's error and is never sent.
func TestCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(1, time.Second))
		get(t.Context(), tr, "") // takes the token
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error)
		go func() { errc <- get(ctx, tr, "") }()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		s, _ := tr.Stats().Lane("api.test")
		if s.Levels[Normal].Queued != 0 || s.Levels[Normal].Cancelled != 1 {
			t.Errorf("queued %d cancelled %d, want 0 and 1", s.Levels[Normal].Queued, s.Levels[Normal].Cancelled)
		}
		time.Sleep(5 * time.Second)
		if n := len(base.times()); n != 1 {
			t.Errorf("base saw %d requests, want 1", n)
		}
		// The cancelled waiter used no token: the next request, one second
		// after the first, goes at once.
		at := time.Now()
		get(t.Context(), tr, "")
		if ts := base.times(); ts[len(ts)-1] != at {
			t.Errorf("next request waited %v", ts[len(ts)-1].Sub(at))
		}
	})
}

// TestGrantVersusCancel cancels waiters at the exact instant their token is
// due, many times over, and checks that every grant that lost the race was
// given back: afterwards the lane has no slot in use and still paces at the
// configured rate.
func TestGrantVersusCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(10, time.Second), WithConcurrency(1, 1))
		var sent, cancelled atomic.Int64
		for round := range 50 {
			start := time.Now()
			get(t.Context(), tr, "") // empties the bucket
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() {
					// Deadlines at, just before and just after the token time.
					d := 100*time.Millisecond + time.Duration(i-1)*time.Nanosecond*time.Duration(round%3)
					ctx, cancel := context.WithDeadlineCause(t.Context(), start.Add(d), errors.New("raced"))
					defer cancel()
					// Avoid the early refusal so that the waiter queues.
					ctx = context.WithoutCancel(ctx)
					ctx, cancel2 := context.WithCancel(ctx)
					defer cancel2()
					go func() { <-time.After(time.Until(start.Add(d))); cancel2() }()
					if err := get(ctx, tr, ""); err == nil {
						sent.Add(1)
					} else {
						cancelled.Add(1)
					}
				})
			}
			wg.Wait()
			time.Sleep(time.Second) // refill
		}
		if got := int64(len(base.times())) - 50; got != sent.Load() {
			t.Errorf("base saw %d raced requests, callers saw %d succeed", got, sent.Load())
		}
		t.Logf("raced waiters: %d sent, %d cancelled", sent.Load(), cancelled.Load())
		if cancelled.Load() == 0 || sent.Load() == 0 {
			t.Errorf("race not exercised: sent %d cancelled %d", sent.Load(), cancelled.Load())
		}
		s, _ := tr.Stats().Lane("api.test")
		if s.InFlight != 0 {
			t.Errorf("slots leaked: in flight %d", s.InFlight)
		}
		// The bucket is full again (1 token): one request goes at once, the
		// next one interval later.
		t0 := time.Now()
		get(t.Context(), tr, "")
		get(t.Context(), tr, "")
		ts := base.times()
		if d := ts[len(ts)-1].Sub(t0); d != 100*time.Millisecond {
			t.Errorf("after the races, second request went after %v, want 100ms", d)
		}
	})
}

// TestCancelAfterGrantRefundsToken: a request cancelled between its grant
// and its send gives the token back.
func TestCancelAfterGrantRefundsToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(1, time.Minute))
		l := tr.lane("api.test")
		ctx, cancel := context.WithCancel(t.Context())
		h, _, err := l.acquire(ctx, Normal, "", firstAttempt, true, false, 0)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		// What attempt does when it finds the context ended after the grant.
		h.Drop()
		at := time.Now()
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		if ts := base.times(); len(ts) != 1 || ts[0] != at {
			t.Errorf("the refunded token was not reused: arrivals %v", ts)
		}
		// And the refund did not make a second token out of nothing.
		ctx2, cancel2 := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel2()
		if err := get(ctx2, tr, ""); !errors.Is(err, ErrRejected) {
			t.Errorf("err = %v, want a refusal (next token in 60s)", err)
		}
	})
}

func TestEarlyRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(10, time.Second), WithMaxWait(Batch, 250*time.Millisecond))
		var wg sync.WaitGroup
		for range 5 { // a queue: 1 sent at once, 4 waiting = 400 ms of backlog
			wg.Go(func() { get(t.Context(), tr, "") })
		}
		synctest.Wait()

		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		err := get(ctx, tr, "")
		var rej *RejectedError
		if !errors.As(err, &rej) {
			t.Fatalf("err = %v, want *RejectedError", err)
		}
		if !errors.Is(err, ErrRejected) || !errors.Is(err, context.DeadlineExceeded) || rej.Reason != ReasonDeadline {
			t.Errorf("deadline refusal %v: reason %v", err, rej.Reason)
		}
		if rej.Wait != 500*time.Millisecond || rej.RetryAfter != rej.Wait {
			t.Errorf("estimate %v retry after %v, want 500ms", rej.Wait, rej.RetryAfter)
		}

		err = get(WithPriority(t.Context(), Batch), tr, "")
		if !errors.As(err, &rej) || rej.Reason != ReasonMaxWait || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("max-wait refusal: %v", err)
		}
		// An Interactive request jumps the queue: its estimate is one token.
		ctx, cancel = context.WithTimeout(WithPriority(t.Context(), Interactive), 150*time.Millisecond)
		defer cancel()
		if err := get(ctx, tr, ""); err != nil {
			t.Errorf("interactive request refused: %v", err)
		}
		wg.Wait()
		s, _ := tr.Stats().Lane("api.test")
		if s.Levels[Normal].Refused[ReasonDeadline] != 1 || s.Levels[Batch].Refused[ReasonMaxWait] != 1 {
			t.Errorf("refusal counters: %+v", s.Levels)
		}
	})
}

// TestLanesIndependent: a lane that is stalled never delays another.
func TestLanesIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The slow lane's server asks for an hour's pause.
		cool := answerWith(1, http.StatusTooManyRequests, "Retry-After: 3600")
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			if req.URL.Host == "slow.test" {
				return cool(req)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}
		}}
		tr := mustNew(t, base, WithRate(1, time.Second), WithRetry(0))
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://slow.test/", nil)
		if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("slow lane's first request: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		ctx, cancel := context.WithCancel(t.Context())
		stalled := make(chan error)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://slow.test/", nil)
			_, err := tr.RoundTrip(req)
			stalled <- err
		}()
		start := time.Now()
		for range 3 {
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("fast lane took %v for 3 requests at 1/s, want 2s", d)
		}
		cancel()
		if err := <-stalled; !errors.Is(err, context.Canceled) {
			t.Errorf("stalled request: %v", err)
		}
		if keys := len(tr.Stats().Lanes); keys != 2 {
			t.Errorf("%d lanes, want 2", keys)
		}
	})
}

func TestWithKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(1, time.Second), WithKey(func(r *http.Request) string { return r.Header.Get("X-Class") }))
		start := time.Now()
		for _, k := range []string{"a", "b", "c"} {
			get(t.Context(), tr, k)
		}
		for _, at := range base.times() {
			if at != start {
				t.Errorf("distinct keys should not wait for each other: %v", at.Sub(start))
			}
		}
		if n := len(tr.Stats().Lanes); n != 3 {
			t.Errorf("lanes = %d, want 3", n)
		}
	})
}

// TestIdleTransportRunsNoGoroutine: the dispatcher exits when the queue drains.
func TestIdleTransportRunsNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(100, time.Second))
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { get(t.Context(), tr, "") })
		}
		wg.Wait()
		synctest.Wait()
		l := tr.lane("api.test")
		l.lock()
		running := l.dispatching
		l.unlock()
		if running {
			t.Error("dispatcher still running on an idle lane")
		}
		// synctest.Test itself fails if any goroutine of the bubble is left.
	})
}

func TestUnpacedLaneBoundsConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Second}
		tr := mustNew(t, base, WithConcurrency(3, 3))
		var wg sync.WaitGroup
		for range 9 {
			wg.Go(func() { get(t.Context(), tr, "") })
		}
		wg.Wait()
		if base.maxIn != 3 {
			t.Errorf("max in flight %d, want 3", base.maxIn)
		}
	})
}

// TestGrantWinsRaceWithCancel drives the race deterministically, both ways:
// the grant is made under the lane's lock while the context is cancelled,
// so the waiter either wakes for its grant and then finds its context done,
// or wakes for its context and then finds itself granted. Both outcomes must
// leave the lane whole.
func TestGrantWinsRaceWithCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(1, time.Hour), WithConcurrency(1, 1))
		l := tr.lane("api.test")
		var outcomes [2]int
		for i := range 200 {
			// The bucket's one token goes to a request, so that the next one
			// queues. It goes at once: the last race gave its token back.
			start := time.Now()
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 0 {
				t.Fatalf("race %d: the lane's token was not given back; a request waited %v", i, d)
			}
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error)
			var h *hold
			go func() {
				var err error
				h, _, err = l.acquire(ctx, Normal, "", firstAttempt, true, false, 0)
				errc <- err
			}()
			synctest.Wait() // queued, blocked in select; its dispatcher sleeps an hour
			l.lock()
			now := l.clk.tick()
			l.pace.Refund(now, true, l.pace.Granted()) // as if the hour's token had come
			if !l.tryTakeLocked(now, false, nil) {
				t.Fatal("no token and slot to grant")
			}
			w := l.q.pop(l.slot.limit, nil)
			if i%2 == 0 {
				l.grantLocked(now, w, nil) // closes ready
				cancel()
			} else {
				cancel() // the waiter wakes and blocks on l.mu
				l.grantLocked(now, w, nil)
			}
			l.unlock()
			if err := <-errc; err == nil {
				outcomes[0]++
				h.Drop() // what attempt does on finding ctx done after the grant
			} else {
				outcomes[1]++
			}
			synctest.Wait() // the dispatcher exits
			// Whole again: nothing in flight or queued, and the token back
			// in the bucket, for the next iteration's request to take.
			ls, _ := tr.LaneStats("api.test")
			if ls.InFlight != 0 || ls.Levels[Normal].Queued != 0 {
				t.Fatalf("after race %d: in flight %d, queued %d", i, ls.InFlight, ls.Levels[Normal].Queued)
			}
		}
		if outcomes[0] == 0 || outcomes[1] == 0 {
			t.Errorf("only one side of the race ran: %v", outcomes)
		}
	})
}

// TestNeverOverRateRealClock: the bucket's half of the bound on the real
// clock, from many goroutines that take tokens the way acquire does (the
// clock read under the lane's lock), in bursts and after pauses: the times
// at which the bucket handed out tokens never hold more than rate x T +
// burst in any window T. (The grant times acquire returns to queued waiters
// are their wake-up times, later than the bucket's, so they are not what is
// checked here.)
func TestNeverOverRateRealClock(t *testing.T) {
	const (
		perSec  = 20000
		burst   = 5
		callers = 32
		each    = 2000
	)
	tr := mustNew(t, nopBase{}, WithRate(perSec, time.Second), WithBurst(burst))
	l := tr.lane("api.test")
	var (
		mu     sync.Mutex
		grants []time.Time
		wg     sync.WaitGroup
	)
	for range callers {
		wg.Go(func() {
			var mine []time.Duration
			for i := range each {
				// Now and then a pause long enough for the bucket to fill.
				if i%16 == 0 {
					time.Sleep(300 * time.Microsecond)
				} else {
					runtime.Gosched()
				}
				l.lock()
				if now := l.clk.tick(); l.tryTakeLocked(now, false, nil) {
					mine = append(mine, now)
					l.slot.put()
				}
				l.unlock()
			}
			mu.Lock()
			for _, d := range mine {
				grants = append(grants, l.clk.timeOf(d))
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(grants) < burst {
		t.Fatalf("only %d grants", len(grants))
	}
	for _, w := range []time.Duration{0, 10 * time.Microsecond, 100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond} {
		limit := int(perSec*w.Seconds()) + burst
		// w+1: a closed window of length w, both ends included.
		got := upstream.MaxInWindow(grants, w+1)
		t.Logf("window %v: at most %d of %d grants, limit %d", w, got, len(grants), limit)
		if got > limit {
			t.Errorf("window %v: %d grants, limit %d", w, got, limit)
		}
	}
}

// TestTransportTracesWritesOnceRefused: once a server refused a lane's
// pace, its attempts carry a trace that tells the lane when each request is
// written (see pace.Pacer.Wrote), beside the caller's own trace, which still
// sees every write; the caller's request keeps its context. Before any
// refusal nothing is traced.
func TestTransportTracesWritesOnceRefused(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := mustNew(t, base, WithRate(50, time.Second), WithRetry(0))
	var wrote atomic.Int32
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Add(1) },
	})
	floor := func() time.Duration {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		l := tr.lane(tr.cfg.key(req))
		l.lock()
		defer l.unlock()
		return l.pace.LagFloor()
	}
	for i := 1; i <= 3; i++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if req.Context() != ctx {
			t.Errorf("request %d: the caller's request has another context", i)
		}
		if got := wrote.Load(); got != int32(i) {
			t.Errorf("request %d: the caller's trace saw %d writes, want %d", i, got, i)
		}
		if f := floor(); i <= 2 && f != 0 || i == 3 && f <= 0 {
			t.Errorf("after request %d (the 2nd refused): the lane's write lag %v", i, f)
		}
	}
}

// TestEarlyRefusalLeavesTheCallItsTime: calls take 200 ms. Behind a queue
// whose wait fits the deadline but leaves the call less than its time,
// a call is refused at once, not admitted to fail at its deadline with
// its token spent.
func TestEarlyRefusalLeavesTheCallItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{latency: 200 * time.Millisecond}, WithRate(10, time.Second))
		for range 3 { // the latency learned
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		}
		var wg sync.WaitGroup
		for range 5 { // 1 sent at once, 4 waiting: the fifth token 400 ms away
			wg.Go(func() { get(t.Context(), tr, "") })
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), 550*time.Millisecond)
		start := time.Now()
		err := get(ctx, tr, "")
		cancel()
		var rej *RejectedError
		if !errors.As(err, &rej) || time.Since(start) != 0 {
			t.Errorf("granted in 500 ms, a call of 200 ms with a deadline of 550 ms: %v after %v, want a refusal at once", err, time.Since(start))
		} else if rej.Wait < 700*time.Millisecond || rej.Wait > 800*time.Millisecond || rej.RetryAfter != 500*time.Millisecond {
			t.Errorf("refusal's wait %v, retry after %v: want about 700ms until the answer (the latency and its deviation), 500ms until the grant", rej.Wait, rej.RetryAfter)
		}
		wg.Wait()
	})
}

// TestEarlyRefusalWithNoOneAhead: with no one waiting ahead, the wait alone
// counts, not the calls' time. On a lane drawing on a Backend (whose every
// call is checked: its estimate counts the shared budget as empty), one
// slow first call (2 s) raised the time counted over the 2 s deadlines,
// and every later call, answered in 100 ms, was refused: a refused call
// teaches the lane no latency.
func TestEarlyRefusalWithNoOneAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 2 * time.Second}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBackend(newMemBackend()))
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		base.mu.Lock()
		base.latency = 100 * time.Millisecond
		base.mu.Unlock()
		refused := 0
		for range 60 {
			time.Sleep(time.Second)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			err := get(ctx, tr, "")
			cancel()
			if errors.Is(err, ErrRejected) {
				refused++
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if refused > 0 {
			t.Errorf("calls of 100 ms after one of 2 s, 2 s deadlines, no one ahead: %d of 60 refused", refused)
		}
	})
}
