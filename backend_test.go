package sluice

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/internal/upstream"
)

// memBackend is a Backend held in memory: what a shared store does, for
// several Transports in one test. Its budget per key is an x/time/rate bucket
// set to the rate and burst of the latest Take.
type memBackend struct {
	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	cool    map[string]time.Time
	leases  map[string]int
	cap     int   // in-flight leases per key; 0: no cap
	err     error // returned by Take when set
	takes   int   // calls to Take
	granted int
	dones   int
	cools   int
}

func newMemBackend() *memBackend {
	return &memBackend{buckets: map[string]*rate.Limiter{}, cool: map[string]time.Time{}, leases: map[string]int{}}
}

func (m *memBackend) Take(ctx context.Context, key string, r float64, burst int) (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.takes++
	if m.err != nil {
		return 0, m.err
	}
	now := time.Now()
	if until := m.cool[key]; now.Before(until) {
		return until.Sub(now), nil
	}
	if m.cap > 0 && m.leases[key] >= m.cap {
		return time.Millisecond, nil
	}
	if r > 0 {
		b, ok := m.buckets[key]
		if !ok {
			b = rate.NewLimiter(rate.Limit(r), burst)
			m.buckets[key] = b
		}
		b.SetLimitAt(now, rate.Limit(r))
		b.SetBurstAt(now, burst)
		res := b.ReserveN(now, 1)
		if d := res.DelayFrom(now); d > 0 {
			res.CancelAt(now)
			return d, nil
		}
	}
	m.leases[key]++
	m.granted++
	return 0, nil
}

func (m *memBackend) Done(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dones++
	m.leases[key]--
}

func (m *memBackend) Cool(ctx context.Context, key string, until time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cools++
	if until.After(m.cool[key]) {
		m.cool[key] = until
	}
	return nil
}

func (m *memBackend) counts() (takes, granted, dones, cools int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.takes, m.granted, m.dones, m.cools
}

// Four Transports paced at the whole rate, as four pods would be, share one
// budget through a Backend: together they stay within rate x T + burst in
// every window and still use the rate, and every lease taken is given back.
func TestBackendSharesRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const R, pods, perPod = 50, 4, 150
		be := newMemBackend()
		base := &fakeBase{latency: 30 * time.Millisecond}
		var wg sync.WaitGroup
		for range pods {
			tr := mustNew(t, base, WithRate(R, time.Second), WithBackend(be))
			for range perPod {
				wg.Go(func() {
					if err := get(t.Context(), tr, ""); err != nil {
						t.Errorf("get: %v", err)
					}
				})
			}
		}
		start := time.Now()
		wg.Wait()
		elapsed := time.Since(start)

		ts := base.times()
		if len(ts) != pods*perPod {
			t.Fatalf("base saw %d requests, want %d", len(ts), pods*perPod)
		}
		for _, w := range []time.Duration{100 * time.Millisecond, time.Second, 5 * time.Second} {
			bound := int(R*w.Seconds()) + DefaultBurst
			// w+1: a closed window of length w, both ends included.
			if got := upstream.MaxInWindow(ts, w+1); got > bound {
				t.Errorf("%d requests within %v, want at most %d", got, w, bound)
			}
		}
		// The last request is sent at (n-1)/R at best, and answered 30 ms later.
		achieved := float64(len(ts)-1) / (ts[len(ts)-1].Sub(ts[0]).Seconds())
		t.Logf("%d pods at %d/s each: %d requests in %v, %.2f/s together", pods, R, len(ts), elapsed, achieved)
		if achieved < 0.95*R {
			t.Errorf("together %.2f/s, want at least %.2f", achieved, 0.95*R)
		}
		synctest.Wait() // Done runs on a goroutine of its own
		takes, granted, dones, _ := be.counts()
		if granted != pods*perPod || dones != granted {
			t.Errorf("backend granted %d and saw %d done (after %d takes), want %d each", granted, dones, takes, pods*perPod)
		}
	})
}

// A Retry-After seen by one Transport pauses every Transport on the key.
func TestBackendSharesCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newMemBackend()
		var once sync.Once
		first := &fakeBase{answer: func(*http.Request) *http.Response {
			status, h := 200, http.Header{}
			once.Do(func() { status = http.StatusTooManyRequests; h.Set("Retry-After", "3") })
			return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(""))}
		}}
		other := &fakeBase{}
		a := mustNew(t, first, WithRate(100, time.Second), WithBackend(be), WithRetry(0))
		b := mustNew(t, other, WithRate(100, time.Second), WithBackend(be))

		start := time.Now()
		if err := get(t.Context(), a, ""); err != nil {
			t.Fatal(err)
		}
		if err := get(t.Context(), b, ""); err != nil {
			t.Fatal(err)
		}
		got := other.times()[0].Sub(start)
		if got < 3*time.Second {
			t.Errorf("the other Transport sent %v after the 429 with Retry-After: 3, want at least 3s", got)
		}
		if _, _, _, cools := be.counts(); cools != 1 {
			t.Errorf("Cool called %d times, want 1", cools)
		}
	})
}

// A Backend error fails the attempt with it; a waiter cancelled during the
// call loses nothing and leaks no lease.
func TestBackendErrorAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errDown := errors.New("store down")
		be := newMemBackend()
		be.err = errDown
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithBackend(be))
		if err := get(t.Context(), tr, ""); !errors.Is(err, errDown) {
			t.Fatalf("get with the backend down: %v, want %v", err, errDown)
		}
		if err := get(WithTenant(t.Context(), "a"), tr, ""); !errors.Is(err, errDown) {
			t.Fatalf("get with the backend down: %v, want %v", err, errDown)
		}
		if lv := levelStats(t, tr, Normal); lv.Tenants != 0 {
			t.Errorf("%d tenants kept after their only request failed", lv.Tenants)
		}

		be.mu.Lock()
		be.err = nil
		be.mu.Unlock()
		// One request takes the token; the next waits 100 ms and is
		// cancelled while it waits.
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if err := get(ctx, tr, ""); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancelled waiter: %v", err)
		}
		synctest.Wait()
		_, granted, dones, _ := be.counts()
		if granted != dones {
			t.Errorf("backend granted %d leases and %d were given back", granted, dones)
		}
		be.mu.Lock()
		left := be.leases["api.test"]
		be.mu.Unlock()
		if left != 0 {
			t.Errorf("%d leases left after all requests ended", left)
		}
	})
}

// A shared in-flight cap below the local limit holds every Transport under it.
func TestBackendInFlightCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newMemBackend()
		be.cap = 3
		base := &fakeBase{latency: 200 * time.Millisecond}
		var wg sync.WaitGroup
		for range 2 {
			tr := mustNew(t, base, WithBackend(be), WithConcurrency(1, 10))
			for range 20 {
				wg.Go(func() {
					if err := get(t.Context(), tr, ""); err != nil {
						t.Errorf("get: %v", err)
					}
				})
			}
		}
		wg.Wait()
		if base.maxIn > 3 {
			t.Errorf("%d in flight across Transports, want at most the shared cap 3", base.maxIn)
		}
		if base.maxIn < 3 {
			t.Errorf("at most %d in flight, want the cap 3 used", base.maxIn)
		}
	})
}

func TestWithBackendNil(t *testing.T) {
	_, err := New(nil, WithBackend(nil))
	if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "WithBackend") {
		t.Errorf("WithBackend(nil): %v", err)
	}
}

// With a Backend the local bucket is never drawn from, so the estimate for
// early refusal must not count its tokens as available.
func TestBackendEstimateIgnoresLocalBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newMemBackend()
		base := &fakeBase{latency: time.Hour}
		tr := mustNew(t, base, WithRate(1, time.Second), WithBurst(20), WithConcurrency(1, 1), WithBackend(be))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		for range 20 { // one in flight, 19 queued
			go get(ctx, tr, "")
		}
		synctest.Wait()
		dl, cancelDL := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancelDL()
		err := get(dl, tr, "")
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Reason != ReasonDeadline || rej.Wait < 19*time.Second {
			t.Errorf("with 19 queued at 1/s and a 5s deadline: %v, want a deadline refusal estimating about 20s", err)
		}
		cancel()
		synctest.Wait()
	})
}

// With a Backend each Transport still serves its own waiters by priority:
// the shared budget's tokens go to its interactive waiters first.
func TestBackendKeepsPriorityOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newMemBackend()
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBackend(be))
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { get(WithPriority(t.Context(), Batch), tr, "batch") })
		}
		synctest.Wait()
		time.Sleep(250 * time.Millisecond) // a few batch requests are sent
		for range 5 {
			wg.Go(func() { get(WithPriority(t.Context(), Interactive), tr, "interactive") })
		}
		wg.Wait()
		var order []string
		base.mu.Lock()
		for _, a := range base.arrivals {
			order = append(order, a.class)
		}
		base.mu.Unlock()
		// The first few are batch (alone at first); once the interactive
		// ones arrive, the next five tokens are theirs.
		i := 0
		for i < len(order) && order[i] == "batch" {
			i++
		}
		if i == 0 || i > 5 || len(order) < i+5 {
			t.Fatalf("send order %v", order)
		}
		for _, c := range order[i : i+5] {
			if c != "interactive" {
				t.Fatalf("after the interactive requests arrived, sent %v; want the next five interactive", order[i:])
			}
		}
	})
}

// takerBackend grants every Take and records the taker of each, by key.
type takerBackend struct {
	mu     sync.Mutex
	takers map[string][]any
}

func (b *takerBackend) Take(ctx context.Context, key string, _ float64, _ int) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.takers[key] = append(b.takers[key], TakerOf(ctx))
	return 0, nil
}
func (b *takerBackend) Done(string)                                   {}
func (b *takerBackend) Cool(context.Context, string, time.Time) error { return nil }

// TestTakerOf: every Take a Transport's lane makes names one taker, and
// another Transport on the same Backend and key names another, so that a
// Backend can keep each one's reserved tokens apart.
func TestTakerOf(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &takerBackend{takers: map[string][]any{}}
		up := upstream.New(upstream.Config{})
		defer up.Close()
		var trs [2]*Transport
		for i := range trs {
			tr, err := New(up.Transport(), WithBackend(b), WithRate(100, time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			trs[i] = tr
		}
		for range 3 {
			for _, tr := range trs {
				req, _ := http.NewRequest("GET", up.URL(), nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
		}
		if TakerOf(context.Background()) != nil {
			t.Error("TakerOf of a context no lane passed is not nil")
		}
		for key, ts := range b.takers {
			if len(ts) != 6 {
				t.Fatalf("%d Takes on %q, want 6", len(ts), key)
			}
			if ts[0] == nil || ts[0] != ts[2] || ts[0] != ts[4] || ts[1] != ts[3] || ts[1] != ts[5] {
				t.Errorf("one Transport's Takes name different takers, or none: %v", ts)
			}
			if ts[0] == ts[1] {
				t.Error("two Transports' Takes name the same taker")
			}
		}
	})
}
