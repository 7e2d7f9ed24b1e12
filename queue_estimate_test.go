package sluice

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestEarlyRefusalTenantTurns: at one level, tenant B has 20 waiters
// and tenant A 3, B first in the rotation. The grants alternate B, A, ...:
// a new A request is the 8th grant (7 ahead), at 0.8 s at 10/s, and a 1 s
// deadline is not refused. An estimate that counted A among the other
// tenants taking turns, and the new waiter's own grant twice, would find
// 12 ahead (1.3 s), and refuse it.
func TestEarlyRefusalTenantTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithBurst(1))
		if err := get(t.Context(), tr, ""); err != nil { // takes the token
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { get(WithTenant(ctx, "B"), tr, "") })
		}
		synctest.Wait()
		for range 3 {
			wg.Go(func() { get(WithTenant(ctx, "A"), tr, "") })
		}
		synctest.Wait()

		dctx, dcancel := context.WithTimeout(WithTenant(t.Context(), "A"), time.Second)
		err := get(dctx, tr, "")
		dcancel()
		var rej *RejectedError
		refused := errors.As(err, &rej)
		if refused {
			t.Logf("refused: %v (estimated wait %v)", err, rej.Wait)
		}

		// The same request without a deadline, from the same state.
		start := time.Now()
		if err := get(WithTenant(t.Context(), "A"), tr, ""); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("served after %v", took)
		if refused && took < time.Second {
			t.Errorf("a request served after %v was refused for its 1 s deadline (estimate %v)", took, rej.Wait)
		}
		cancel()
		wg.Wait()
	})
}

// TestEarlyRefusalLowShareBelowTop: 5 Batch calls, then 20
// Interactive, then a Normal call wait at 10/s with the default low share.
// Every 10th grant goes to the longest waiter below Interactive, a Batch
// call: the Normal call is the 23rd grant (2.3 s), and a 2.2 s deadline is
// refused at once. An estimate of the 20 Interactive calls alone (2.1 s)
// admitted it, to fail at its deadline.
func TestEarlyRefusalLowShareBelowTop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithBurst(1))
		if err := get(t.Context(), tr, ""); err != nil { // takes the token
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() { get(WithPriority(ctx, Batch), tr, "") })
		}
		synctest.Wait()
		for range 20 {
			wg.Go(func() { get(WithPriority(ctx, Interactive), tr, "") })
		}
		synctest.Wait()
		wantRefusedAtOnce(t, WithPriority(t.Context(), Normal), tr, 2200*time.Millisecond, "Normal call with a 2.2 s deadline, granted at 2.3 s")
		cancel()
		wg.Wait()
	})
}

// TestHugeAgingKeepsPriority: WithAging(math.MaxInt64), aging that never
// lifts anyone, keeps a fresh Interactive waiter ahead of a Batch one;
// level x aging saturates, where it wrapped for Batch (2 x MaxInt64 to -2)
// and ranked Batch first.
func TestHugeAgingKeepsPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBurst(1), WithAging(time.Duration(1<<63-1)))
		if err := get(t.Context(), tr, "first"); err != nil { // takes the token
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { get(WithPriority(t.Context(), Batch), tr, "batch") })
		synctest.Wait()
		wg.Go(func() { get(WithPriority(t.Context(), Interactive), tr, "interactive") })
		synctest.Wait()
		wg.Wait()
		base.mu.Lock()
		defer base.mu.Unlock()
		if got := base.arrivals[1].class; got != "interactive" {
			t.Errorf("second grant went to %s, want interactive (a fresh Batch waiter cannot outrank it)", got)
		}
	})
}

// TestTenantQueueCountsEveryLevel: WithTenantQueue(1) refuses a request
// whose tenant has one attempt waiting in the lane at any level: a tenant
// with one waiting at Normal does not queue another at Batch nor at
// Interactive, as it could when each level counted its own.
func TestTenantQueueCountsEveryLevel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Second}
		tr := mustNew(t, base, WithConcurrency(1, 1), WithTenantQueue(1))
		ctx, cancel := context.WithCancel(WithTenant(t.Context(), "a"))
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for _, p := range []Priority{Normal, Normal, Batch, Interactive} {
			wg.Go(func() { errs <- get(WithPriority(ctx, p), tr, "") })
			synctest.Wait()
		}
		lv := tr.Stats()
		ls, _ := lv.Lane("api.test")
		queued := 0
		for _, l := range ls.Levels {
			queued += l.Queued
		}
		if queued > 1 {
			t.Errorf("tenant a has %d attempts waiting in the lane under WithTenantQueue(1)", queued)
		}
		cancel()
		wg.Wait()
	})
}

// TestEarlyRefusalCappedTenantAbove: an Interactive tenant at its cap
// (WithTenantShare) has 50 calls queued that cannot be sent until its call
// in flight, a minute long, ends. A Normal call is served within one token
// (0.1 s): the capped waiters do not hold it up, and a 1 s deadline is not
// refused. Counting every Interactive waiter as ahead refused it.
func TestEarlyRefusalCappedTenantAbove(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Minute}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBurst(1), WithConcurrency(10, 10),
			WithTenantShare(Interactive, 0.1)) // a cap of 1
		ctx, cancel := context.WithCancel(WithTenant(WithPriority(t.Context(), Interactive), "big"))
		defer cancel()
		var wg sync.WaitGroup
		for range 51 { // one in flight, 50 held at the tenant's cap
			wg.Go(func() { get(ctx, tr, "") })
		}
		synctest.Wait()

		dctx, dcancel := context.WithTimeout(WithPriority(t.Context(), Normal), time.Second)
		err := get(dctx, tr, "")
		dcancel()
		var rej *RejectedError
		refused := errors.As(err, &rej)

		if !refused {
			cancel()
			wg.Wait()
			return
		}
		// The same call without a deadline, from the same state.
		nctx, ncancel := context.WithCancel(WithPriority(t.Context(), Normal))
		start := time.Now()
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(nctx, http.MethodGet, "http://api.test/x", nil)
			if resp, err := tr.RoundTrip(req); err == nil { // sent when granted; the answer takes a minute
				resp.Body.Close()
			}
		})
		time.Sleep(time.Second)
		if n := len(base.times()); n != 2 {
			t.Fatalf("%d sent, want 2: the first Interactive call and the Normal one", n)
		}
		sentAt := base.times()[1].Sub(start)
		t.Logf("the same Normal call without a deadline is sent after %v", sentAt)
		if sentAt < time.Second {
			t.Errorf("Normal call with a 1 s deadline refused (%v), though it is sent after %v", err, sentAt)
		}
		ncancel()
		cancel()
		wg.Wait()
	})
}

// TestTenantCapOfHugeLimit: WithTenantShare(p, 1) with a limit near
// math.MaxInt (WithConcurrency(1, math.MaxInt): a paced lane starts at its
// max) caps a tenant at the limit; float64(limit) x share rounds to 2^63,
// whose conversion to int overflowed and capped every tenant at 1.
func TestTenantCapOfHugeLimit(t *testing.T) {
	var lv levelQueue
	lv.init(Normal, 1)
	if got := lv.capOf(1<<63 - 1); got < 1<<62 {
		t.Errorf("share 1 of limit MaxInt: cap %d, want the limit", got)
	}
}

// TestEarlyRefusalHugeLowShare: WithLowShare(1<<62), a share so rare it
// is near strict priority: a Batch call behind 20 Interactive calls at
// 10/s (granted after about 2.1 s) is refused for a 1 s deadline.
// lowShare x (lower+1) overflowed, the estimate went negative, and the call
// was admitted to fail at its deadline.
func TestEarlyRefusalHugeLowShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithBurst(1), WithLowShare(1<<62))
		if err := get(t.Context(), tr, ""); err != nil { // takes the token
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { get(WithPriority(ctx, Batch), tr, "") })
		synctest.Wait()
		for range 20 {
			wg.Go(func() { get(WithPriority(ctx, Interactive), tr, "") })
		}
		synctest.Wait()
		wantRefusedAtOnce(t, WithPriority(t.Context(), Batch), tr, time.Second, "Batch call behind 20 Interactive and 1 Batch, 1 s deadline")
		cancel()
		wg.Wait()
	})
}

// TestEarlyRefusalAgingTie: with WithAging(1s), Batch calls queued at 0
// rank 0+2s; a Normal call at 1 s ranks 1s+1s, a tie that the Batch calls
// win (they were queued first). The estimate counts them, and the Normal
// call with a 1 s deadline is refused at once, not admitted to fail at
// its deadline.
func TestEarlyRefusalAgingTie(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithBurst(1), WithAging(time.Second), WithLowShare(0))
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		for range 40 {
			wg.Go(func() { get(WithPriority(ctx, Batch), tr, "") })
		}
		time.Sleep(time.Second)
		wantRefusedAtOnce(t, WithPriority(t.Context(), Normal), tr, time.Second, "Normal call behind ~30 Batch calls that outrank it, 1 s deadline")
		cancel()
		wg.Wait()
	})
}

// wantRefusedAtOnce sends a request of ctx with a deadline d from now
// through tr, and fails t unless the early refusal refuses it; what names
// the request.
func wantRefusedAtOnce(t *testing.T, ctx context.Context, tr http.RoundTripper, d time.Duration, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	if err := get(ctx, tr, ""); !errors.Is(err, ErrRejected) {
		t.Errorf("%s: %v after %v, want a refusal at once", what, err, time.Since(start))
	}
}
