package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/internal/upstream"
	"github.com/sluice-go/sluice/internal/verdict"
)

// countPrepaid counts the lanes' prepayments until the test ends.
func countPrepaid(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	testHookPrepay = func(*lane, int) { n.Add(1) }
	t.Cleanup(func() { testHookPrepay = nil })
	return &n
}

// TestPrepaidGrantsKeepTheBound: a lane at 5,000/s that runs under its
// rate hands out prepaid grants, and waves of 200 requests at once, which
// find its bucket full and grants prepaid besides, still go out within
// rate x T + burst + 1 in every window T: the prepaid grants count against
// the bucket's size.
func TestPrepaidGrantsKeepTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			perSec = 5000
			burst  = 50
		)
		prepaid := countPrepaid(t)
		base := &fakeBase{latency: time.Millisecond}
		tr := mustNew(t, base, WithRate(perSec, time.Second), WithBurst(burst), WithConcurrency(512, 512))
		end := time.Now().Add(2 * time.Second)
		var wg sync.WaitGroup
		for range 4 { // 800/s between the waves, which leaves grants prepaid
			wg.Go(func() {
				for time.Now().Before(end) {
					get(t.Context(), tr, "")
					time.Sleep(4 * time.Millisecond)
				}
			})
		}
		time.Sleep(2500 * time.Microsecond) // the waves come between the callers' instants
		for time.Now().Before(end) {
			time.Sleep(100 * time.Millisecond)
			for range 200 {
				wg.Go(func() { get(t.Context(), tr, "") })
			}
		}
		wg.Wait()
		if prepaid.Load() == 0 {
			t.Fatal("no grant was prepaid: the test measures nothing")
		}
		ts := base.times()
		for _, w := range []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second} {
			limit := int(perSec*w.Seconds()) + burst + 1
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

// TestPrepaidGrantsKeepTheCooldown: a 429 with Retry-After takes back the
// grants a busy lane prepaid: no request reaches the server after the
// refusal and before the cooldown it set ends. The refusal comes at each
// of sampleEvery points of the lane's cycle of prepayments, so that some
// find grants prepaid and left.
func TestPrepaidGrantsKeepTheCooldown(t *testing.T) {
	for k := range sampleEvery {
		t.Run(fmt.Sprint(k), func(t *testing.T) { keepsTheCooldown(t, int64(2000+k)) })
	}
}

func keepsTheCooldown(t *testing.T, nth int64) {
	synctest.Test(t, func(t *testing.T) {
		prepaid := countPrepaid(t)
		var (
			mu        sync.Mutex
			refusedAt time.Time
			until     time.Time
			n         atomic.Int64
		)
		base := &fakeBase{latency: time.Millisecond}
		base.answer = func(*http.Request) *http.Response {
			if n.Add(1) == nth {
				mu.Lock()
				refusedAt = time.Now()
				mu.Unlock()
				return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}},
					Body: io.NopCloser(strings.NewReader(""))}
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok\n"))}
		}
		tr := mustNew(t, base, WithRate(100_000, time.Second), WithBurst(100), WithRetry(0),
			WithObserver(ObserverFunc(func(_ context.Context, e Event) {
				if e.Kind == EventCooldown {
					mu.Lock()
					until = e.Until
					mu.Unlock()
				}
			})))
		end := time.Now().Add(1500 * time.Millisecond)
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				// Spread over the millisecond, so that callers come back
				// at other instants than the refusal's.
				time.Sleep(time.Duration(i) * 50 * time.Microsecond)
				for time.Now().Before(end) {
					get(t.Context(), tr, "")
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Wait()
		tr.WaitEvents(t.Context())
		if prepaid.Load() == 0 {
			t.Fatal("no grant was prepaid: the test measures nothing")
		}
		mu.Lock()
		defer mu.Unlock()
		if refusedAt.IsZero() || !until.After(refusedAt) {
			t.Fatalf("refused at %v, cooldown until %v", refusedAt, until)
		}
		var early int
		for _, at := range base.times() {
			if at.After(refusedAt) && at.Before(until) {
				early++
			}
		}
		if early > 0 {
			t.Errorf("%d requests reached the server within the cooldown of %v", early, until.Sub(refusedAt))
		}
	})
}

// prepaidLoad drives do with the load of TestPrepaidGrantsKeepTheBound on
// the real clock for d: four callers in loops a millisecond apart, and a
// wave of 200 at once every 100 ms.
func prepaidLoad(do func() error, d time.Duration) {
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(end) {
				do()
				time.Sleep(time.Millisecond)
			}
		})
	}
	for time.Now().Before(end) {
		time.Sleep(100 * time.Millisecond)
		for range 200 {
			wg.Go(func() { do() })
		}
	}
	wg.Wait()
}

// TestPrepaidGrantsKeepTheBoundRealClock is TestPrepaidGrantsKeepTheBound
// on the real clock, beside x/time/rate + a semaphore under the same load:
// the grants a lane hands out, prepaid ones included, keep within rate x T
// + burst + 1, by the instants they were charged (the arrivals at the base
// add the scheduler's delays, and are logged for both).
func TestPrepaidGrantsKeepTheBoundRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of a second")
	}
	const (
		perSec = 5000
		burst  = 50
	)
	prepaid := countPrepaid(t)
	var mu sync.Mutex
	granted := map[time.Duration]int{}
	testHookGrant = func(l *lane, at time.Duration) {
		mu.Lock()
		granted[at]++
		mu.Unlock()
	}
	testHookRefund = func(l *lane, at time.Duration) {
		mu.Lock()
		granted[at]--
		mu.Unlock()
	}
	defer func() { testHookGrant, testHookRefund = nil, nil }()

	base := &stampBase{}
	tr := mustNew(t, base, WithRate(perSec, time.Second), WithBurst(burst), WithConcurrency(512, 512))
	prepaidLoad(func() error { return get(t.Context(), tr, "") }, time.Second)
	tr.Stats() // settles the prepaid grants handed out last, which the hook then sees

	pairBase := &stampBase{}
	lim := rate.NewLimiter(perSec, burst)
	sem := semaphore.NewWeighted(512)
	prepaidLoad(func() error {
		if err := lim.Wait(t.Context()); err != nil {
			return err
		}
		if err := sem.Acquire(t.Context(), 1); err != nil {
			return err
		}
		defer sem.Release(1)
		return get(t.Context(), pairBase, "")
	}, time.Second)

	if prepaid.Load() == 0 {
		t.Fatal("no grant was prepaid: the test measures nothing")
	}
	l := tr.lane("api.test")
	mu.Lock()
	var grants []time.Time
	for d, n := range granted {
		for range n {
			grants = append(grants, l.clk.timeOf(d))
		}
	}
	mu.Unlock()
	base.mu.Lock()
	pairBase.mu.Lock()
	defer base.mu.Unlock()
	defer pairBase.mu.Unlock()
	if len(grants) != len(base.at) {
		t.Fatalf("%d grants, %d arrivals at the base", len(grants), len(base.at))
	}
	t.Logf("%d prepayments; sent: sluice %d, x/time/rate + semaphore %d", prepaid.Load(), len(base.at), len(pairBase.at))
	for _, w := range []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond} {
		limit := int(perSec*w.Seconds()) + burst + 1
		got := upstream.MaxInWindow(grants, w+1)
		t.Logf("window %v: bound %d; sluice grants %d, arrivals %d; x/time/rate + semaphore arrivals %d",
			w, limit, got, upstream.MaxInWindow(base.at, w+1), upstream.MaxInWindow(pairBase.at, w+1))
		if got > limit {
			t.Errorf("window %v: %d grants, bound rate x T + burst + 1 = %d", w, got, limit)
		}
	}
}

// untilPrepaid sends requests to tr's lane api.test until it has prepaid
// grants, and returns the lane.
func untilPrepaid(t *testing.T, tr *Transport) *lane {
	t.Helper()
	l := tr.lane("api.test")
	for i := 0; l.fast.Load()&fastMask == 0; i++ {
		if i == 1000 {
			t.Fatal("the lane prepaid no grant")
		}
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// takeAllPrepaid takes every prepaid grant l has left, and returns their
// holds in the order they were taken.
func takeAllPrepaid(t *testing.T, l *lane) []*hold {
	var hs []*hold
	for {
		h := l.takePrepaid(t.Context(), Normal, "")
		if h == nil {
			return hs
		}
		hs = append(hs, h)
	}
}

// TestPrepaidPendingHoldReachesAWaiter: a prepaid grant that its taker was
// still filling in when the lane settled stays unsettled; given back
// while a request waits for its slot, the slot reaches that request at
// once, with no other request to settle it.
func TestPrepaidPendingHoldReachesAWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 40
		tr := mustNew(t, bodyBase{}, WithRate(1e6, time.Second), WithBurst(1000), WithConcurrency(limit, limit))
		l := untilPrepaid(t, tr)
		// A taker that has taken the count down and not yet filled in
		// its hold: the state it sets last is not set.
		h := l.takePrepaid(t.Context(), Normal, "")
		atomic.StoreUint32(&h.state, 0)
		// Every other slot taken, then a request that waits for one.
		var bodies []io.ReadCloser
		var mu sync.Mutex
		var wg sync.WaitGroup
		waiting := make(chan struct{})
		for range limit {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://api.test/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				bodies = append(bodies, resp.Body)
				if len(bodies) == limit {
					close(waiting)
				}
				mu.Unlock()
			})
		}
		synctest.Wait()
		mu.Lock()
		if n := len(bodies); n != limit-1 {
			t.Fatalf("%d requests out of %d slots with one held, want %d", n, limit, limit-1)
		}
		mu.Unlock()
		atomic.StoreUint32(&h.state, holdTaken) // filled in
		h.Done(verdict.Served)
		synctest.Wait()
		select {
		case <-waiting:
		default:
			t.Error("the waiting request still waits after the prepaid grant's slot was given back")
		}
		mu.Lock()
		for _, b := range bodies[:limit-1] {
			b.Close()
		}
		mu.Unlock()
		wg.Wait() // the waiting request's body comes last, whether or not in time
		for _, b := range bodies[limit-1:] {
			b.Close()
		}
	})
}

// TestPrepaidIdleLaneSettled: the prepaid grants of a batch taken to the
// last and given back with no lock after them are settled by the last
// given back: the idle lane counts no slot in use and nothing unsettled.
// The second case has the lane's settle find the last grant's taker still
// filling in its hold.
func TestPrepaidIdleLaneSettled(t *testing.T) {
	for _, pending := range []bool{false, true} {
		t.Run(fmt.Sprintf("pending=%v", pending), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := mustNew(t, bodyBase{}, WithRate(1e6, time.Second), WithBurst(1000), WithConcurrency(40, 40))
				l := untilPrepaid(t, tr)
				hs := takeAllPrepaid(t, l)
				last := hs[len(hs)-1]
				if pending {
					atomic.StoreUint32(&last.state, 0)
					l.lock() // settles all but the last, which it finds pending
					l.unlock()
				}
				for _, h := range hs[:len(hs)-1] {
					h.Done(verdict.Served)
				}
				if pending {
					atomic.StoreUint32(&last.state, holdTaken) // filled in
				}
				last.Done(verdict.Served)
				synctest.Wait()
				l.mu.Lock() // not lock: that would settle
				inUse, unsettled := l.slot.inUse, l.unsettled()
				l.mu.Unlock()
				if inUse != 0 || unsettled {
					t.Errorf("idle lane after %d prepaid grants given back: %d slots in use, unsettled %v", len(hs), inUse, unsettled)
				}
			})
		})
	}
}

// TestPrepaidGivenBackDuringASettle: a prepaid grant given back while
// another owner's settle holds the lane's lock, a settle that found the
// grant's taker still filling it in, is settled before that lock is let
// go for good: the owner that found the lock held relies on its holder.
// Left unsettled, its slot would stay in use on an idle lane, and a
// request waiting for it would wait for an unrelated lock.
func TestPrepaidGivenBackDuringASettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, bodyBase{}, WithRate(1e6, time.Second), WithBurst(1000), WithConcurrency(40, 40))
		l := untilPrepaid(t, tr)
		hs := takeAllPrepaid(t, l)
		if len(hs) < 3 {
			t.Fatalf("%d grants prepaid, want at least 3", len(hs))
		}
		// The last grant's taker is still filling its hold in; the first
		// grant's owner gives it back, and its settle stops at the first
		// hold it counts, the lock held, the last one found pending.
		first, last := hs[0], hs[len(hs)-1]
		atomic.StoreUint32(&last.state, 0)
		reached, proceed := make(chan struct{}), make(chan struct{})
		var once sync.Once
		testHookGrant = func(*lane, time.Duration) {
			once.Do(func() { close(reached); <-proceed })
		}
		defer func() { testHookGrant = nil }()
		go first.Done(verdict.Served)
		<-reached
		// The taker fills it in, and its owner gives it back while the
		// lock is held.
		atomic.StoreUint32(&last.state, holdTaken)
		last.Done(verdict.Served)
		close(proceed)
		synctest.Wait()
		l.mu.Lock() // not lock: that would settle
		inUse := l.slot.inUse
		l.mu.Unlock()
		if want := len(hs) - 2; inUse != want {
			t.Errorf("%d prepaid grants out, 2 given back and the lock free: %d slots in use, want %d", len(hs), inUse, want)
		}
		for _, h := range hs[1 : len(hs)-1] {
			h.Done(verdict.Served)
		}
	})
}

// TestPrepaidSlotsNotInFlight: four callers keep a lane at 2,000/s busy,
// which prepays its grants. The limiter's mean in flight, which its cut
// under queueing scales, is the callers' four, not four and the slots
// taken ahead for grants nobody has yet (31 at most), which it read as
// 35.
func TestPrepaidSlotsNotInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prepaid := countPrepaid(t)
		base := &fakeBase{latency: 2 * time.Millisecond}
		tr := mustNew(t, base, WithRate(100000, time.Second), WithBurst(1000))
		const callers = 4
		end := time.Now().Add(5 * time.Second)
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := get(context.Background(), tr, ""); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if prepaid.Load() == 0 {
			t.Fatal("the lane prepaid no grants: the test says nothing")
		}
		l := tr.lane("api.test")
		l.lock()
		inFlight := l.slot.prevL
		l.unlock()
		// Callers that complete at one instant may count one another
		// before their returns are settled: up to twice the callers.
		if inFlight < callers || inFlight > 2*callers {
			t.Errorf("the limiter's mean in flight over its last window is %.2f, want %d to %d", inFlight, callers, 2*callers)
		}
	})
}

// TestPrepaidGrantWhileTheLockIsHeld: an attempt that finds a busy lane's
// lock held takes a prepaid grant laid out meanwhile, without waiting for
// the lock; a retry, which may not have one, waits for the lock.
func TestPrepaidGrantWhileTheLockIsHeld(t *testing.T) {
	tr := mustNew(t, bodyBase{}, WithRate(1e6, time.Second), WithBurst(1000), WithConcurrency(40, 40))
	l := untilPrepaid(t, tr)
	l.mu.Lock() // as the timed grant that laid the grants out holds it
	got := make(chan *hold, 1)
	go func() { got <- l.lockSlow(t.Context(), Normal, "", true) }()
	select {
	case h := <-got:
		if h == nil {
			t.Fatal("lockSlow returned the lock that the test holds")
		}
		if s := atomic.LoadUint32(&h.state); s&holdTaken == 0 || s&holdHeld != 0 {
			t.Errorf("the hold's state is %#x, want a prepaid grant's", s)
		}
		h.Done(verdict.Served)
	case <-time.After(10 * time.Second):
		l.mu.Unlock()
		<-got
		t.Fatal("an attempt waited for the lock with prepaid grants left")
	}
	go func() { got <- l.lockSlow(t.Context(), Normal, "", false) }()
	runtime.Gosched()
	select {
	case h := <-got:
		t.Fatalf("a retry's lockSlow returned %v while the lock was held", h)
	default:
	}
	l.mu.Unlock()
	if h := <-got; h != nil {
		t.Fatalf("a retry's lockSlow returned a prepaid grant")
	}
	l.mu.Unlock() // the retry's
}
