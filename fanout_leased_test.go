package sluice

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
)

// TestForEachFollowsLeasedInFlight: ForEach runs as many items at once as
// t can send, and a Leaser's share that caps the lane at 2 in flight
// (sluiceredis.WithInFlight) caps what it can send, whatever its local
// limit: ForEach parks no item beyond its lookahead in the lane's queue.
func TestForEachFollowsLeasedInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{memBackend: *newMemBackend()}
		base := newGateBase()
		tr := mustNew(t, base, WithBackend(f), WithRetry(0), WithConcurrency(1, 64))
		defer tr.Close()
		l := tr.lane("api.test")
		pinLimit(l, 20)
		ctx, cancel := context.WithCancel(t.Context())
		c := &count{n: 1_000}
		var live gauge
		done := make(chan error, 1)
		go func() {
			done <- ForEach(ctx, tr, c.seq(), func(ctx context.Context, i int) error {
				live.inc()
				defer live.dec()
				return get(ctx, tr, "")
			})
		}()
		synctest.Wait()
		f.grantAll(Share{Rate: 1000, Burst: 10, InFlight: 2})
		synctest.Wait()
		if in := base.in.cur.Load(); in > 2 {
			t.Fatalf("%d at the base under a share of 2", in)
		}
		// Items started before the first share finish; the bound then holds
		// (a lower limit cancels nothing, and stops new starts).
		for range 40 {
			base.release <- struct{}{}
			synctest.Wait()
		}
		if got, want := live.cur.Load(), int64(2+ForEachLookahead); got > want {
			t.Errorf("%d items running while the lane may send 2 at once; want at most %d", got, want)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("ForEach = %v", err)
		}
	})
}
