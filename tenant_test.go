package sluice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/stats"
)

// tenantBase answers after latency and records, per tenant (the X-Tenant
// header), how many requests it holds at once.
type tenantBase struct {
	latency time.Duration
	mu      sync.Mutex
	in      map[string]int
	maxIn   map[string]int
}

func newTenantBase(latency time.Duration) *tenantBase {
	return &tenantBase{latency: latency, in: map[string]int{}, maxIn: map[string]int{}}
}

func (b *tenantBase) RoundTrip(req *http.Request) (*http.Response, error) {
	id := req.Header.Get("X-Tenant")
	b.mu.Lock()
	b.in[id]++
	b.maxIn[id] = max(b.maxIn[id], b.in[id])
	b.mu.Unlock()
	time.Sleep(b.latency) // virtual time: the bubble's clock
	b.mu.Lock()
	b.in[id]--
	b.mu.Unlock()
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

func (b *tenantBase) maxInFlight(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.maxIn[id]
}

// tenantGet sends one request as tenant id (none if id is "") and returns
// how long it took from the call to the end of its body.
func tenantGet(ctx context.Context, tr http.RoundTripper, id string) (time.Duration, error) {
	start := time.Now()
	if id != "" {
		ctx = WithTenant(ctx, id)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/x", nil)
	req.Header.Set("X-Tenant", id)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(start), nil
}

type tenantRow struct {
	served   int
	waits    []time.Duration
	maxIn    int
	finished time.Time
}

// runTenantScenario: tenant "big" submits 1,000 requests at t=0; nine
// others submit 10 each at t=1s; one level, 20 in flight, 100 ms calls.
func runTenantScenario(t *testing.T, tagTenants bool, opts ...Option) (map[string]*tenantRow, time.Time) {
	base := newTenantBase(100 * time.Millisecond)
	tr := mustNew(t, base, append([]Option{WithConcurrency(20, 20)}, opts...)...)
	rows := map[string]*tenantRow{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	send := func(id string) {
		wg.Go(func() {
			sendAs := id
			if !tagTenants {
				sendAs = ""
			}
			ctx := t.Context()
			d, err := tenantGet(ctx, tr, sendAs)
			if err != nil {
				t.Errorf("tenant %s: %v", id, err)
				return
			}
			mu.Lock()
			r := rows[id]
			r.served++
			r.waits = append(r.waits, d)
			r.finished = time.Now()
			mu.Unlock()
		})
	}
	t0 := time.Now()
	rows["big"] = &tenantRow{}
	for i := range 9 {
		rows[fmt.Sprintf("small-%d", i)] = &tenantRow{}
	}
	for range 1000 {
		send("big")
	}
	time.Sleep(time.Second)
	for i := range 9 {
		for range 10 {
			send(fmt.Sprintf("small-%d", i))
		}
	}
	wg.Wait()
	for id, r := range rows {
		r.maxIn = base.maxInFlight(id)
		if !tagTenants {
			r.maxIn = -1 // every request was the anonymous tenant's
		}
	}
	return rows, t0
}

func logTenantTable(t *testing.T, name string, rows map[string]*tenantRow, t0 time.Time) {
	t.Logf("%s", name)
	t.Logf("  %-8s %6s %9s %9s %7s %9s", "tenant", "served", "wait p50", "wait p99", "max in", "done at")
	for _, id := range []string{"big", "small-0", "small-4", "small-8"} {
		r := rows[id]
		t.Logf("  %-8s %6d %9v %9v %7d %9v", id, r.served, stats.Quantile(r.waits, 0.5).Round(time.Millisecond),
			stats.Quantile(r.waits, 0.99).Round(time.Millisecond), r.maxIn, r.finished.Sub(t0).Round(time.Millisecond))
	}
}

// The seed's per-tenant cap scenario: one tenant's 1,000 requests do not
// hold up nine tenants that arrive a second later, and the big tenant never
// holds more than its cap.
func TestTenantFairness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const share = 0.25 // of 20: a cap of 5
		rows, t0 := runTenantScenario(t, true, WithTenantShare(Normal, share))
		logTenantTable(t, "tenants take turns, share 0.25 (cap 5 of 20)", rows, t0)

		big := rows["big"]
		if big.served != 1000 {
			t.Errorf("big served %d, want 1000", big.served)
		}
		if big.maxIn > 5 {
			t.Errorf("big held %d in flight, want at most its cap 5", big.maxIn)
		}
		if big.maxIn < 5 {
			t.Errorf("big held at most %d in flight, want its cap 5 used", big.maxIn)
		}
		for i := range 9 {
			r := rows[fmt.Sprintf("small-%d", i)]
			if r.served != 10 {
				t.Errorf("small-%d served %d, want 10", i, r.served)
			}
			// The nine's 90 requests share the 15 slots the big tenant's
			// cap leaves, 100 ms each: 600 ms, plus one turn; not the big
			// tenant's backlog of seconds (about 4 s in one FIFO).
			if p99 := stats.Quantile(r.waits, 0.99); p99 > 700*time.Millisecond {
				t.Errorf("small-%d wait p99 %v, want at most 700ms", i, p99)
			}
		}
	})
}

// Without tenants the same load is one FIFO: the nine wait behind the
// backlog. This is the row the fairness test is measured against.
func TestTenantFairnessBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rows, t0 := runTenantScenario(t, false)
		logTenantTable(t, "no tenants (one FIFO)", rows, t0)
		// 20 in flight at 100 ms: 200/s; at t=1s about 800 requests are
		// ahead of the nine, about 4 s of waiting.
		if p50 := stats.Quantile(rows["small-0"].waits, 0.5); p50 < 3*time.Second {
			t.Errorf("without tenants small-0 waited p50 %v, want the backlog's seconds", p50)
		}
	})
}

// Tenants take turns even without a cap: grants rotate, so a tenant with one
// request is served within a turn of the others, not after a backlog.
func TestTenantsRotateWithoutCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rows, t0 := runTenantScenario(t, true)
		logTenantTable(t, "tenants take turns, no cap", rows, t0)
		for i := range 9 {
			r := rows[fmt.Sprintf("small-%d", i)]
			// 20 slots turn over every 100 ms; the ten tenants take turns
			// at each grant, so each small tenant gets about 2 slots per
			// 100 ms: its 10 requests take about 500 ms.
			if p99 := stats.Quantile(r.waits, 0.99); p99 > 700*time.Millisecond {
				t.Errorf("small-%d wait p99 %v, want under 700ms", i, p99)
			}
		}
		if rows["big"].maxIn <= 5 {
			t.Errorf("without a cap big held at most %d in flight, want more than 5", rows["big"].maxIn)
		}
	})
}

// A share that rounds to zero admits one request at a time, never none.
func TestTenantShareRoundsToZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := newTenantBase(50 * time.Millisecond)
		tr := mustNew(t, base, WithConcurrency(20, 20), WithTenantShare(Batch, 0.01))
		ctx := WithPriority(t.Context(), Batch)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				if _, err := tenantGet(ctx, tr, "tiny"); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if got := base.maxInFlight("tiny"); got != 1 {
			t.Errorf("tenant with share 0.01 of 20 held %d in flight, want 1", got)
		}
	})
}

// A waiter whose tenant is at its cap keeps its place: when the tenant drops
// under the cap, its oldest waiter is served before its newer ones.
func TestTenantCapKeepsFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Request i takes 100+i ms, so no two finish, and no two are
		// granted, at the same instant: the send order is the grant order.
		var mu sync.Mutex
		var order []string
		in, maxIn := 0, 0
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			class := req.Header.Get("X-Class")
			var i int
			fmt.Sscan(class, &i)
			mu.Lock()
			order = append(order, class)
			in++
			maxIn = max(maxIn, in)
			mu.Unlock()
			time.Sleep(time.Duration(100+i) * time.Millisecond)
			mu.Lock()
			in--
			mu.Unlock()
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
		})
		tr := mustNew(t, base, WithConcurrency(4, 4), WithTenantShare(Normal, 0.5))
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if err := get(WithTenant(t.Context(), "a"), tr, fmt.Sprint(i)); err != nil {
					t.Error(err)
				}
			})
			synctest.Wait() // queue them in order
		}
		wg.Wait()
		if got := strings.Join(order, ","); got != "0,1,2,3,4,5,6,7" {
			t.Errorf("one tenant's requests sent in order %s, want FIFO", got)
		}
		if maxIn != 2 {
			t.Errorf("%d in flight, want the tenant's cap of 2", maxIn)
		}
	})
}

// The queue bounds refuse at once and say which bound: the tenant's own, or
// the lane's.
func TestQueueBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Second}
		tr := mustNew(t, base, WithConcurrency(1, 1), WithTenantQueue(2), WithMaxQueue(4))
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		send := func(id string) {
			wg.Go(func() {
				ctx := t.Context()
				if id != "" {
					ctx = WithTenant(ctx, id)
				}
				errs <- get(ctx, tr, "")
			})
			synctest.Wait()
		}
		send("a") // in flight
		send("a") // queued 1
		send("a") // queued 2
		send("a") // refused: tenant a has 2 queued
		send("b") // queued 3
		send("")  // queued 4: the anonymous tenant has no own bound
		send("c") // refused: the lane has 4 queued
		wg.Wait()
		close(errs)
		var tenantRej, fullRej, ok int
		for err := range errs {
			var rej *RejectedError
			switch {
			case err == nil:
				ok++
			case errors.As(err, &rej) && rej.Reason == ReasonTenantQueue:
				tenantRej++
				if rej.Tenant != "a" || rej.Queued != 2 || !strings.Contains(err.Error(), `tenant "a"`) {
					t.Errorf("tenant refusal: %+v: %v", rej, err)
				}
			case errors.As(err, &rej) && rej.Reason == ReasonQueueFull:
				fullRej++
				if rej.Queued != 4 {
					t.Errorf("queue-full refusal: %+v", rej)
				}
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}
		if ok != 5 || tenantRej != 1 || fullRej != 1 {
			t.Errorf("served %d, tenant-queue refusals %d, queue-full refusals %d; want 5, 1, 1", ok, tenantRej, fullRej)
		}
		lv := levelStats(t, tr, Normal)
		if lv.Refused[ReasonTenantQueue] != 1 || lv.Refused[ReasonQueueFull] != 1 {
			t.Errorf("stats refused %v, want one of each queue bound", lv.Refused)
		}
	})
}

// Stats report active tenants and the busiest few, and none once they have
// all gone (their records: TestLevelForgetsIdleTenants).
func TestTenantStatsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 10 * time.Millisecond}
		tr := mustNew(t, base, WithConcurrency(50, 50))
		var wg sync.WaitGroup
		for i := range 10_000 {
			wg.Go(func() {
				if err := get(WithTenant(t.Context(), fmt.Sprint("t", i)), tr, ""); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		lv := levelStats(t, tr, Normal)
		if lv.Tenants != 10_000 || len(lv.Top) != TopTenants || lv.Queued < 9_950 {
			t.Errorf("while queued: %d tenants, top %d, queued %d; want 10000, %d, 9950", lv.Tenants, len(lv.Top), lv.Queued, TopTenants)
		}
		wg.Wait()
		lv = levelStats(t, tr, Normal)
		if lv.Tenants != 0 || len(lv.Top) != 0 {
			t.Errorf("after: %d tenants, top %v; want none", lv.Tenants, lv.Top)
		}
	})
}

// Top lists the busiest tenants first.
func TestTenantStatsTop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Second}
		tr := mustNew(t, base, WithConcurrency(2, 2))
		var wg sync.WaitGroup
		for i, n := range []int{3, 1, 7, 2, 5, 4, 6} {
			for range n {
				wg.Go(func() {
					if err := get(WithTenant(t.Context(), fmt.Sprint("t", i)), tr, ""); err != nil {
						t.Error(err)
					}
				})
			}
		}
		synctest.Wait()
		lv := levelStats(t, tr, Normal)
		var got []string
		for _, ts := range lv.Top {
			got = append(got, fmt.Sprintf("%s=%d", ts.ID, ts.InFlight+ts.Queued))
		}
		if s := strings.Join(got, ","); s != "t2=7,t6=6,t4=5,t5=4,t0=3" || lv.Tenants != 7 {
			t.Errorf("top %s of %d tenants, want t2=7,t6=6,t4=5,t5=4,t0=3 of 7", s, lv.Tenants)
		}
		wg.Wait()
	})
}

// levelStats returns the stats of level p of tr's lane "api.test".
func levelStats(t *testing.T, tr *Transport, p Priority) LevelStats {
	t.Helper()
	ls, ok := tr.Stats().Lane("api.test")
	if !ok {
		t.Fatal("no lane api.test")
	}
	return ls.Levels[p]
}

// A tenant held at its cap is served as soon as a larger limit lifts the
// cap, not only when one of its own attempts ends.
func TestTenantCapFollowsLimitUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Hour}
		tr := mustNew(t, base, WithConcurrency(1, 20), WithTenantShare(Normal, 0.5))
		l := tr.lane("api.test")
		l.lock()
		l.setLimitLocked(2) // a cap of 1
		l.unlock()
		ctx, cancel := context.WithCancel(WithTenant(t.Context(), "a"))
		defer cancel()
		for range 2 {
			go get(ctx, tr, "")
			synctest.Wait()
		}
		if n := len(base.times()); n != 1 {
			t.Fatalf("%d sent under a cap of 1, want 1", n)
		}
		l.lock()
		l.setLimitLocked(10) // a cap of 5
		l.unlock()
		synctest.Wait()
		if n := len(base.times()); n != 2 {
			t.Errorf("%d sent after the cap grew to 5, want 2", n)
		}
		cancel()
		synctest.Wait()
	})
}

// The seed's worked caps (002, "Per-tenant caps"): a pool of 24 in flight,
// shares 0.25 / 0.10 / 0.04 give 6 / 2 / 1; the last rounds to zero and the
// floor of 1 keeps the tenant served.
func TestTenantCapSeed(t *testing.T) {
	for _, c := range []struct {
		share float64
		want  int
	}{{0.25, 6}, {0.10, 2}, {0.04, 1}, {1, 24}} {
		var lv levelQueue
		lv.init(Normal, c.share)
		if got := lv.capOf(24); got != c.want {
			t.Errorf("share %v of 24: cap %d, want %d", c.share, got, c.want)
		}
	}
}

// TestTenantRecordKeptAcrossASettle: a tenant's last attempt, given back
// while another held the lane's lock, is settled by the tenant's next
// acquire, which ends the tenant's record; the acquire uses a live record,
// not the one forgotten: the tenant's queue bound holds, and another
// tenant with nothing queued is not refused for it.
func TestTenantRecordKeptAcrossASettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(1, time.Second), WithBurst(1), WithTenantQueue(1))
		l := tr.lane("api.test")
		a := WithTenant(t.Context(), "A")
		h, _, err := l.acquire(a, Normal, "A", firstAttempt, true, false, 0)
		if err != nil {
			t.Fatal(err)
		}
		// A's answer is done while another goroutine holds the lock.
		l.mu.Lock()
		if !l.listReturned(h, false) {
			t.Fatal("the hold was not listed")
		}
		l.mu.Unlock()
		var wg sync.WaitGroup
		wg.Go(func() { get(a, tr, "") }) // no token: queued
		synctest.Wait()
		wg.Go(func() {
			if err := get(WithTenant(t.Context(), "B"), tr, ""); errors.Is(err, ErrRejected) {
				t.Errorf("B, with nothing queued, refused: %v", err)
			}
		})
		synctest.Wait() // A and B queued
		if err := get(a, tr, ""); !errors.Is(err, ErrRejected) {
			t.Errorf("A's second queued call, past WithTenantQueue(1): %v, want a refusal", err)
		}
		wg.Wait()
	})
}

// TestCostRefusalNamesTenant: a ReasonCost refusal carries the
// request's tenant (RejectedError.Tenant, and the EventRefused), as every
// other refusal does.
func TestCostRefusalNamesTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var evs []Event
		obs := ObserverFunc(func(_ context.Context, e Event) {
			mu.Lock()
			evs = append(evs, e)
			mu.Unlock()
		})
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 10, time.Minute), WithObserver(obs))
		defer tr.Close()
		err := get(WithCost(WithTenant(t.Context(), "acme"), "tokens", 100), tr, "")
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Reason != ReasonCost {
			t.Fatalf("err = %v, want a cost refusal", err)
		}
		if rej.Tenant != "acme" {
			t.Errorf("RejectedError.Tenant = %q, want %q", rej.Tenant, "acme")
		}
		tr.WaitEvents(t.Context())
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			if e.Kind == EventRefused && e.Tenant != "acme" {
				t.Errorf("EventRefused.Tenant = %q, want %q", e.Tenant, "acme")
			}
		}
	})
}

// TestEstimateCountsTenantTurnsByPlace: at one level, tenant A is at the
// front of the rotation with one waiter, and nine tenants behind it have
// five waiters each. A new A request takes its turn after A's waiter and
// one turn of each of the nine: it is the 11th grant, at 1.1 s at 10/s,
// and its 1.5 s deadline is not refused. (Two turns of each other tenant,
// whatever A's place in the rotation, made it 19 ahead, 2 s.)
func TestEstimateCountsTenantTurnsByPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithBurst(1))
		if err := get(t.Context(), tr, ""); err != nil { // takes the token
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { get(WithTenant(ctx, "A"), tr, "") }) // A first in the rotation
		synctest.Wait()
		for i := range 9 {
			id := string(rune('B' + i))
			for range 5 {
				wg.Go(func() { get(WithTenant(ctx, id), tr, "") })
			}
		}
		synctest.Wait()

		dctx, dcancel := context.WithTimeout(WithTenant(t.Context(), "A"), 1500*time.Millisecond)
		err := get(dctx, tr, "")
		dcancel()
		var rej *RejectedError
		refused := errors.As(err, &rej)

		// The same request without a deadline, from the same state.
		start := time.Now()
		if err := get(WithTenant(t.Context(), "A"), tr, ""); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("served after %v; deadline request: %v", took, err)
		if refused && took < 1500*time.Millisecond {
			t.Errorf("a request served after %v was refused for its 1.5 s deadline (estimated wait %v)", took, rej.Wait)
		}
		cancel()
		wg.Wait()
	})
}

// TestEstimateSkipsTenantsAtTheirCap: twenty Normal tenants are each at
// their cap of one in flight (WithTenantShare, a call of a minute), each
// with one more call waiting at the cap. A new tenant's Normal call is the
// only one the gate may serve: it is sent with the next token, at once
// here, and its 1 s deadline is not refused: the held tenants take no
// turns ahead of it (counted, they were 20 ahead, 2 s at 10/s).
// TestEarlyRefusalCappedTenantAbove covers a capped tenant at a level
// above.
func TestEstimateSkipsTenantsAtTheirCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Minute}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBurst(1), WithConcurrency(100, 100),
			WithTenantShare(Normal, 0.01)) // a cap of 1
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		for i := range 20 {
			tctx := WithTenant(ctx, "t"+string(rune('a'+i)))
			for range 2 { // one in flight, one held at the cap
				wg.Go(func() { get(tctx, tr, "") })
			}
		}
		time.Sleep(3 * time.Second) // the twenty first calls are sent; the bucket is full again
		synctest.Wait()
		if n := len(base.times()); n != 20 {
			t.Fatalf("%d sent, want 20", n)
		}

		dctx, dcancel := context.WithTimeout(WithTenant(t.Context(), "new"), time.Second)
		err := get(dctx, tr, "")
		dcancel()
		var rej *RejectedError
		if !errors.As(err, &rej) {
			cancel()
			wg.Wait()
			return
		}
		// The same call without a deadline, from the same state.
		nctx, ncancel := context.WithCancel(WithTenant(t.Context(), "new"))
		start := time.Now()
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(nctx, http.MethodGet, "http://api.test/x", nil)
			if resp, err := tr.RoundTrip(req); err == nil { // sent when granted; the answer takes a minute
				resp.Body.Close()
			}
		})
		synctest.Wait()
		sent := len(base.times()) == 21
		t.Logf("the same call without a deadline: sent at once %v (after %v)", sent, time.Since(start))
		if sent {
			t.Errorf("new tenant's call with a 1 s deadline refused (%v), though the gate serves it at once", err)
		}
		ncancel()
		cancel()
		wg.Wait()
	})
}
