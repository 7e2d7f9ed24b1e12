package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestTimedOutTakeLeavesNoLease: a Take that times out on a stalled Redis
// has its script queued in the server, which runs it when it resumes and
// takes a lease for a call that has long gone to the fallback. The Backend
// gives that lease back soon after Redis answers again, rather than leaving
// the place taken for the whole ttl.
func TestTimedOutTakeLeavesNoLease(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, newClient(t, srv.Addr()), WithTimeout(DefaultTimeout),
		WithInFlight(4, time.Minute), withProbeEvery(100*time.Millisecond))
	ctx := context.Background()
	// Load the script, so that the stalled call is one EVALSHA.
	if w, err := b.Take(ctx, "warm", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	b.Done("warm")

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// A slow rate: the tat key the script sets lives for 100s.
	w, err := b.Take(ctx, "api", 0.01, 1)
	if err != nil {
		t.Fatalf("Take on a stalled Redis = %v, %v; want the fallback", w, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Take on a stalled Redis returned after %v", d)
	}
	if healthy(b.backend) {
		t.Fatal("the timed-out Take did not mark Redis down")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()

	// The stalled script runs once Redis resumes (its tat key shows it),
	// and the lease it took must not stay: poll for up to two probe
	// intervals and a second of slack for a loaded machine.
	var ran bool
	var leases int64
	for deadline := resumed.Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ran = c.Exists(ctx, "sluice:{api}:tat").Val() == 1 || c.Exists(ctx, "sluice:{api}:gone").Val() == 1
		leases = c.ZCard(ctx, "sluice:{api}:lease").Val()
		if ran && leases == 0 {
			break
		}
	}
	t.Logf("after Redis resumed: the stalled script ran or was cancelled: %v; %d leases left after %v",
		ran, leases, time.Since(resumed).Round(time.Millisecond))
	if !ran {
		t.Fatal("the stalled script never ran and nothing cancelled it: the test tested nothing")
	}
	if leases != 0 {
		t.Errorf("%d leases held in Redis by a call that timed out, want 0", leases)
	}
	giveBack(b)
}

// TestReleaseBeforeLateRun: when the release of a timed-out call reaches
// Redis before the call itself (still queued behind a stall, or in the
// network), the call takes nothing when it runs: no lease, no token.
func TestReleaseBeforeLateRun(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	k := newKeys(DefaultPrefix, "api")
	const member = "gone-process:1"
	if err := runRelease(ctx, c, k, time.Minute, []string{member}); err != nil {
		t.Fatal(err)
	}
	st, _, err := runTake(ctx, c, k, takeArgs{rate: 1, burst: 1, leases: 4, leaseTTL: time.Minute, member: member}, nil)
	if err != nil || st != cancelled {
		t.Fatalf("take.lua for a released member = %v, %v; want cancelled", st, err)
	}
	if n := c.ZCard(ctx, k.lease()).Val(); n != 0 {
		t.Errorf("%d leases after a cancelled call ran, want 0", n)
	}
	if c.Exists(ctx, k[0]).Val() != 0 {
		t.Error("a cancelled call moved the GCRA state: its token is lost")
	}
	// Another member takes its lease as usual; the cancellation is
	// forgotten after its ttl.
	if st, _, err := runTake(ctx, c, k, takeArgs{rate: 1, burst: 1, leases: 4, leaseTTL: time.Minute, member: "live:1"}, nil); err != nil || st != taken {
		t.Fatalf("take.lua for another member = %v, %v; want taken", st, err)
	}
	if ttl := c.PTTL(ctx, k.gone()).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("the cancellations expire in %v, want within the lease ttl of %v", ttl, time.Minute)
	}
}

// TestCloseGivesBackEverything: Close gives back the leases of attempts
// granted, of tokens reserved and of calls that timed out, stops the
// renewer and the releaser, and leaves a Backend that refuses clearly.
func TestCloseGivesBackEverything(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, newClient(t, srv.Addr()), WithInFlight(10, time.Minute), WithTimeout(DefaultTimeout))
	ctx := context.Background()
	zcard := func(key string) int64 { return c.ZCard(ctx, "sluice:{"+key+"}:lease").Val() }
	for range 2 {
		if w, err := b.Take(ctx, "a", 0, 1); w != 0 || err != nil {
			t.Fatalf("Take = %v, %v", w, err)
		}
	}
	if w, err := b.Take(ctx, "b", 1, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	if w, err := b.Take(ctx, "b", 1, 1); w == 0 || err != nil { // reserved
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	// A call on a stalled Redis that runs once it resumes. (A slow rate:
	// the tat key the script sets shows that it ran.)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Take(ctx, "c", 0.01, 1); err != nil {
		t.Fatalf("Take on a stalled Redis: %v; want the fallback", err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Second); c.Exists(ctx, "sluice:{c}:tat").Val() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	// Its lease may be given back already, if the releaser found Redis
	// back; if not, Close must give it back.
	if got := [3]int64{zcard("a"), zcard("b"), zcard("c")}; got[0] != 2 || got[1] != 2 {
		t.Fatalf("leases before Close = %v, want [2 2 0 or 1]", got)
	}
	b.mu.Lock()
	running := b.renewing
	b.mu.Unlock()
	if !running {
		t.Fatal("the renewer does not run before Close: the test tests less than it says")
	}

	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := [3]int64{zcard("a"), zcard("b"), zcard("c")}; got != [3]int64{} {
		t.Errorf("leases after Close = %v, want none", got)
	}
	b.mu.Lock()
	running = b.renewing || b.releasing
	b.mu.Unlock()
	if running {
		t.Error("a goroutine still runs after Close")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	b.Done("a") // nothing left to give back; must not panic or call Redis
	_, err := b.Take(ctx, "a", 0, 1)
	if !errors.Is(err, ErrClosed) || !strings.HasPrefix(err.Error(), "sluiceredis: ") {
		t.Errorf("Take after Close: %v, want ErrClosed", err)
	}
	if err := b.Cool(ctx, "a", time.Now().Add(time.Second)); !errors.Is(err, ErrClosed) {
		t.Errorf("Cool after Close: %v, want ErrClosed", err)
	}
}

// TestCloseWithRedisDown: Close is bounded by the timeout when Redis does
// not answer, and says how many leases it could not give back.
func TestCloseWithRedisDown(t *testing.T) {
	srv := startRedis(t)
	b := newTokens(t, newClient(t, srv.Addr()), WithInFlight(10, time.Minute), WithTimeout(DefaultTimeout))
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		if w, err := b.Take(ctx, key, 0, 1); w != 0 || err != nil {
			t.Fatalf("Take = %v, %v", w, err)
		}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	start := time.Now()
	err := b.Close()
	took := time.Since(start)
	t.Logf("Close on a stalled Redis: %v after %v", err, took)
	if err == nil || !strings.HasPrefix(err.Error(), "sluiceredis: ") || !strings.Contains(err.Error(), "3 leases") {
		t.Errorf("Close on a stalled Redis: %v, want an error counting 3 leases", err)
	}
	// One timeout, not one per budget; seconds of slack for a loaded machine.
	if took > 2*time.Second {
		t.Errorf("Close took %v on a stalled Redis; the timeout is %v", took, DefaultTimeout)
	}
}

// TestCloseSharesWithRedisDown: a Backend closed while Redis does not
// answer gives up on its shares after one call, a timeout, however many
// keys it shares; with Redis up, it gives every share back in one call.
func TestCloseSharesWithRedisDown(t *testing.T) {
	const keys = 200
	for _, down := range []bool{false, true} {
		t.Run(fmt.Sprintf("down=%v", down), func(t *testing.T) {
			srv := startRedis(t)
			c := newClient(t, srv.Addr())
			b := newBackend(t, c, WithRefresh(100*time.Millisecond), WithTimeout(DefaultTimeout))
			var lanes []*shareLane
			for i := range keys {
				lanes = append(lanes, joinLane(t, b, fmt.Sprintf("key-%d", i), batch100))
			}
			for _, l := range lanes {
				waitShare(t, l, 100, "alone")
			}
			if down {
				if err := srv.Pause(); err != nil {
					t.Fatal(err)
				}
				defer srv.Resume()
			}
			n := countCalls(c)
			start := time.Now()
			b.Close()
			t.Logf("Close of %d shares: %d calls, %v", keys, n.n.Load(), time.Since(start))
			// A call a key would be 200, each a timeout on a stalled Redis.
			if calls := n.n.Load(); calls != 1 {
				t.Errorf("Close of %d shares made %d calls to Redis, want 1 (one pipeline)", keys, calls)
			}
			if down {
				return
			}
			for i := range keys {
				if n := c.HLen(context.Background(), newKeys(DefaultPrefix, fmt.Sprintf("key-%d", i)).shares()).Val(); n != 0 {
					t.Fatalf("key-%d: %d entries left after Close", i, n)
				}
			}
		})
	}
}
