package sluiceredis

// The budgets (budget.go, budget.lua) when processes and lanes go, and
// when Redis fails over, goes away, loses an answer or holds a bad state:
// the fleet is never granted more than the budget holds.

import (
	"context"
	"github.com/redis/go-redis/v9"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// spendingDemand is a lane that wants far more than the budget (a queue of
// 1e6) and spends at once what it is granted (its Level stays 0).
func spendingDemand(size int, per time.Duration) sluice.Demand {
	d := batch100
	d.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: size, Per: per, Queued: [3]float64{0, 0, 1e6}, Need: 100}}
	return d
}

// levelOf reads the fleet's ungranted level of budget "tokens" of key
// "api" (the "=" state's first field); -1 if none.
func levelOf(t *testing.T, addr string) float64 {
	t.Helper()
	c := newClient(t, addr)
	s, err := c.HGet(context.Background(), budgetKey(newKeys(DefaultPrefix, "api"), "tokens"), "=").Result()
	if err != nil {
		return -1
	}
	f, _ := strconv.ParseFloat(strings.Fields(s)[0], 64)
	return f
}

// TestBudgetFirstAfterAFailover: both processes lose Redis for longer than
// their lease and fall back to half the budget each; the master that takes
// over has no hashes, and a reaches it first. As its share of the rate
// (see shareKey.most), a's first grant of the budget is bounded by its
// part (30,000 of 60,000 a minute), while b still spends its fallback's
// half: it was granted all 60,000.
func TestBudgetFirstAfterAFailover(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	ca, cb := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	cutA, cutB := cutCalls(ca), cutCalls(cb)
	a := newBackend(t, ca, WithRefresh(refresh))
	b := newBackend(t, cb, WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	la := joinLane(t, a, "api", spendingDemand(60000, time.Minute))
	lb := joinLane(t, b, "api", spendingDemand(60000, time.Minute))
	waitShare(t, la, 50, "a")
	waitShare(t, lb, 50, "b")
	time.Sleep(500 * time.Millisecond)

	cut := time.Now()
	cutA.cut.Store(true)
	cutB.cut.Store(true)
	time.Sleep(shareLeases*refresh + 3*refresh) // both fall back
	// The replica that takes over never had the hashes.
	if err := newClient(t, srv.Addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	fa := added(la.since(cut))
	back := time.Now()
	cutA.cut.Store(false) // a reaches the new master first; b not yet
	time.Sleep(2 * refresh)
	first := la.since(back)
	if len(first) == 0 {
		t.Fatal("no grant for a after Redis came back")
	}
	ga, rate := added(first[:1]), first[0].s.Rate
	gb := added(lb.since(cut))
	t.Logf("a: fallback grants %.0f before Redis came back; at its first answered refresh (%v after): rate share %.1f/s, budget granted %.0f",
		fa, first[0].at.Sub(back).Round(time.Millisecond), rate, ga)
	t.Logf("b (still falling back): %.0f granted since the cut", gb)
	if rate > 50+1e-9 {
		t.Errorf("rate: a's first share %.1f over the 50 it held", rate)
	}
	// a's fair part: half the budget (30,000), as its fallback held at most.
	if ga > 30000 {
		t.Errorf("budget: a granted %.0f of a 60,000 budget at its first answered refresh, over its half (30,000), while b still spends its fallback half", ga)
	}
	cutB.cut.Store(false)
}

// TestBudgetOutageChargesTheFallback: Redis goes away (no data lost) for
// longer than the budget's period. Each process falls back to its half of
// the refill and spends it, while Redis's level refills on its clock: the
// fleet's level is charged what the fallbacks granted when Redis answers
// again, and the fleet, saturated at the cut (1,000 a second), is granted
// at most the refill over the window (it was granted the budget again on
// top of the refill it had spent).
func TestBudgetOutageChargesTheFallback(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	ca, cb := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	cutA, cutB := cutCalls(ca), cutCalls(cb)
	a := newBackend(t, ca, WithRefresh(refresh))
	b := newBackend(t, cb, WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	la := joinLane(t, a, "api", spendingDemand(1000, time.Second))
	lb := joinLane(t, b, "api", spendingDemand(1000, time.Second))
	time.Sleep(1500 * time.Millisecond)

	lvl := levelOf(t, srv.Addr())
	cut := time.Now()
	cutA.cut.Store(true)
	cutB.cut.Store(true)
	time.Sleep(2 * time.Second)
	during := added(la.since(cut)) + added(lb.since(cut))
	back := time.Now()
	cutA.cut.Store(false)
	cutB.cut.Store(false)
	time.Sleep(3 * refresh)
	end := time.Now()
	after := added(la.since(back)) + added(lb.since(back))
	total := during + after
	most := max(lvl, 0) + 1000*end.Sub(cut).Seconds()
	t.Logf("level at the cut %.0f; granted during the %v outage (fallback) %.0f; in the %v after it %.0f; total %.0f, most the budget allows %.0f",
		lvl, back.Sub(cut).Round(time.Millisecond), during, end.Sub(back).Round(time.Millisecond), after, total, most)
	if total > most+100 {
		t.Errorf("granted %.0f over %v from a 1,000/s budget that held %.0f at the start: %.0f over", total, end.Sub(cut).Round(time.Millisecond), lvl, total-most)
	}
}

// TestBudgetLaneGoneGivesBackWhatItHolds: a lane that goes (its Transport
// closed) between refreshes gives back what it holds when it goes, not
// what it held after its last grant. A budget of 10,000 a day (no refill
// in the test): a's lane is granted 5,000, spends it and goes; b, wanting
// the whole budget, is granted the 5,000 left (it was granted 10,000).
func TestBudgetLaneGoneGivesBackWhatItHolds(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	d := batch100
	d.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: 10000, Per: 24 * time.Hour, Queued: [3]float64{0, 0, 5000}, Need: 5000}}
	la := joinLane(t, a, "api", d)
	// A second lane of a on the key, which wants nothing: the key lives on.
	idle := batch100
	idle.Waiting = [3]int{}
	idle.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: 10000, Per: 24 * time.Hour}}
	joinLane(t, a, "api", idle)
	waitGranted(t, la, 5000)
	// It spends the 5,000 at once and its Transport is closed, before the
	// next refresh reads it.
	la.mu.Lock()
	la.d.Budgets[0].Spent += 5000
	la.d.Budgets[0].Queued = [3]float64{}
	la.d.Budgets[0].Need = 0
	la.gone = true
	la.mu.Unlock()
	time.Sleep(3 * refresh)
	lbb := joinLane(t, b, "api", spendingDemand(10000, 24*time.Hour))
	time.Sleep(5 * refresh)
	ga, gb := added(la.since(time.Time{})), added(lbb.since(time.Time{}))
	t.Logf("granted: a's lane %.0f (spent), b %.0f; %.0f of a budget of 10,000 that does not refill", ga, gb, ga+gb)
	if ga+gb > 10000+1 {
		t.Errorf("granted %.0f of a 10,000 budget: the gone lane's spent %.0f was given back to the fleet", ga+gb, ga)
	}
}

// TestBudgetClosedProcessGivesBackNothing: the same for a process that
// closes (or dies) after spending its last grant: its entry expires and
// gives back nothing (it gave back what it held at its last refresh,
// which it had spent).
func TestBudgetClosedProcessGivesBackNothing(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer b.Close()
	d := batch100
	d.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: 10000, Per: 24 * time.Hour, Queued: [3]float64{0, 0, 5000}, Need: 5000}}
	la := joinLane(t, a, "api", d)
	waitGranted(t, la, 5000)
	// a spends the 5,000 and shuts down before its next refresh.
	a.Close()
	lbb := joinLane(t, b, "api", spendingDemand(10000, 24*time.Hour))
	time.Sleep(shareLeases*refresh + 5*refresh)
	ga, gb := added(la.since(time.Time{})), added(lbb.since(time.Time{}))
	t.Logf("granted: a %.0f (spent, then closed), b %.0f; %.0f of a budget of 10,000 that does not refill", ga, gb, ga+gb)
	if ga+gb > 10000+1 {
		t.Errorf("granted %.0f of a 10,000 budget: a's spent %.0f was freed when its entry expired", ga+gb, ga)
	}
}

// TestBudgetScriptFailsFallsBack: budget.lua fails for a key while
// share.lua answers (WRONGTYPE: something else wrote the budget's key),
// or the budget's state holds a number that is not finite: the lanes fall
// back after a lease as they do without Redis, or the state is dropped.
// Either way they are granted the budget (they were granted nothing, and
// a NaN spread to every process on the key).
func TestBudgetScriptFailsFallsBack(t *testing.T) {
	const refresh = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		put  func(c context.Context, t *testing.T, addr string)
	}{
		{"wrongtype", func(ctx context.Context, t *testing.T, addr string) {
			newClient(t, addr).Set(ctx, budgetKey(newKeys(DefaultPrefix, "api"), "tokens"), "x", 0)
		}},
		{"inf-margin", func(ctx context.Context, t *testing.T, addr string) {
			newClient(t, addr).HSet(ctx, budgetKey(newKeys(DefaultPrefix, "api"), "tokens"), "=", "0 0 inf 0 0")
		}},
		{"nan-level", func(ctx context.Context, t *testing.T, addr string) {
			newClient(t, addr).HSet(ctx, budgetKey(newKeys(DefaultPrefix, "api"), "tokens"), "=", "nan 0 0 0 0")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRedis(t)
			tc.put(context.Background(), t, srv.Addr())
			var lg logs
			a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh), WithLogger(slog.New(&lg)))
			defer a.Close()
			la := joinLane(t, a, "api", spendingDemand(60000, time.Minute))
			time.Sleep(2 * time.Second)
			g := la.since(time.Time{})
			t.Logf("%d grants, rate %.1f, budget granted %.0f in 2s (%d warnings)", len(g), la.last().s.Rate, added(g), lg.count(slog.LevelWarn))
			st, _ := newClient(t, srv.Addr()).HGetAll(context.Background(), budgetKey(newKeys(DefaultPrefix, "api"), "tokens")).Result()
			t.Logf("the budget's hash after: %v", st)
			if !(added(g) >= 1000) { // NaN too
				t.Errorf("budget granted %.0f in 2s of a 60,000/min budget (1,000/s): frozen, with no fallback", added(g))
			}
		})
	}
}

// TestBudgetSpentThenClosed, end to end with Transports: process a sends
// one call of 5,000 tokens of a 10,000-a-day budget and closes its
// Transport (as a job or a pod that shuts down does); process b then
// sends calls of 5,000 for 2s. The server receives no more than 10,000
// tokens (it received 15,000).
func TestBudgetSpentThenClosed(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	var mu sync.Mutex
	received := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.Header.Get("X-Cost"))
		mu.Lock()
		received += n
		mu.Unlock()
	}))
	defer up.Close()
	newTr := func(b *Backend) *sluice.Transport {
		tr, err := sluice.New(nil, sluice.WithRate(100, time.Second), sluice.WithBudget("tokens", 10000, 24*time.Hour),
			sluice.WithBackend(b), sluice.WithRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	send := func(tr *sluice.Transport, ctx context.Context) error {
		req, _ := http.NewRequestWithContext(sluice.WithCost(ctx, "tokens", 5000), "POST", up.URL, nil)
		req.Header.Set("X-Cost", "5000")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil
	}
	a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	tra := newTr(a)
	if err := send(tra, context.Background()); err != nil {
		t.Fatal(err)
	}
	tra.Close()
	trb := newTr(b)
	// Three callers without a deadline (a deadline would be refused at once
	// on the estimated wait); the Transport is closed after 2s.
	var wg sync.WaitGroup
	var sentB atomic.Int64
	for range 3 {
		wg.Go(func() {
			if send(trb, context.Background()) == nil {
				sentB.Add(1)
			}
		})
	}
	time.Sleep(2 * time.Second)
	trb.Close()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("a sent 1 call of 5,000 and closed; b sent %d calls of 5,000; the server received %d tokens of a 10,000 budget", sentB.Load(), received)
	if received > 10000 {
		t.Errorf("the server received %d tokens of a budget of 10,000 a day", received)
	}
}

// loser is a go-redis hook that, while armed, lets the next budget.lua
// call run on Redis and then loses its reply (as a timeout after Redis
// ran it does).
type loser struct{ armed, lost atomic.Bool }

func (l *loser) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *loser) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (l *loser) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && callsScript(cmd, ":budget:") && l.armed.CompareAndSwap(true, false) {
			l.lost.Store(true)
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return err
	}
}

// holdLane is a lane that holds what it is granted of its budget (its
// Level follows the grants) and wants want of it beyond.
type holdLane struct {
	mu     sync.Mutex
	d      sluice.Demand
	grants float64
}

func (l *holdLane) demand() (sluice.Demand, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.d
	d.Budgets = append([]sluice.BudgetDemand(nil), l.d.Budgets...)
	return d, true
}

func (l *holdLane) grant(s sluice.Share) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(s.Budgets) > 0 {
		l.d.Budgets[0].Level += s.Budgets[0].Add
		l.grants += s.Budgets[0].Add
	}
}

// TestBudgetLostAnswerGivesBackOnce: a budget.lua call that Redis ran but
// whose answer was lost added what the caller gave back to the fleet's
// level; the caller's lanes no longer count it, so it is not given back
// again. A budget of 10,000 a day (no refill): a is granted all of it,
// then wants none; its give-back's answer is lost, and its calls fail for
// 250ms more (less than its lease); b, which spends what it is granted,
// is granted 10,000 in all (it was granted 20,000).
func TestBudgetLostAnswerGivesBackOnce(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	ca := newClient(t, srv.Addr())
	cut := cutCalls(ca)
	lose := &loser{}
	ca.AddHook(lose)
	a := newBackend(t, ca, WithRefresh(refresh))
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	la := &holdLane{d: batch100}
	la.d.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: 10000, Per: 24 * time.Hour, Queued: [3]float64{0, 0, 10000}, Need: 10000}}
	if !a.Join("api", la.demand, la.grant) {
		t.Fatal("Join declined")
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		la.mu.Lock()
		lvl := la.d.Budgets[0].Level
		la.mu.Unlock()
		if lvl >= 10000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a holds %v, want 10,000", lvl)
		}
		time.Sleep(time.Millisecond)
	}
	lb := joinLane(t, b, "api", spendingDemand(10000, 24*time.Hour)) // spends what it is granted
	time.Sleep(2 * refresh)
	// a wants no more: it gives its 10,000 back, and that reply is lost.
	la.mu.Lock()
	la.d.Budgets[0].Queued, la.d.Budgets[0].Need = [3]float64{}, 0
	la.mu.Unlock()
	lose.armed.Store(true)
	for !lose.lost.Load() {
		time.Sleep(time.Millisecond)
	}
	// The stall that lost the reply goes on for a few refreshes (less than
	// a's lease): b refreshes meanwhile.
	cut.cut.Store(true)
	time.Sleep(2500 * time.Microsecond * 100)
	cut.cut.Store(false)
	time.Sleep(8 * refresh)
	la.mu.Lock()
	ga, left := la.grants, la.d.Budgets[0].Level
	la.mu.Unlock()
	gb := added(lb.since(time.Time{}))
	t.Logf("reply lost: %v; a: net granted %.0f (holds %.0f); b granted %.0f (spent); in all %.0f of a 10,000 budget that does not refill", lose.lost.Load(), ga, left, gb, ga+gb)
	if ga+gb > 10000+1 {
		t.Errorf("net grants %.0f of a 10,000 budget: a's give-back counted twice", ga+gb)
	}
}

// failer fails (without running it) the next budget.lua call while armed.
type failer struct{ armed, failed atomic.Bool }

func (l *failer) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *failer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (l *failer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if callsScript(cmd, ":budget:") && l.armed.CompareAndSwap(true, false) {
			l.failed.Store(true)
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return next(ctx, cmd)
	}
}

// TestBudgetServerCountAfterAFailedCall: a server count passed in a
// budget.lua call that failed is passed again at the next. The server
// says nothing remains (Seen 1, Server 0) of a 10,000-a-day budget Redis
// takes as full; the first budget call fails; the lane is granted nothing
// (it was granted the budget, the count lost with the call).
func TestBudgetServerCountAfterAFailedCall(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	ca := newClient(t, srv.Addr())
	f := &failer{}
	f.armed.Store(true)
	ca.AddHook(f)
	a := newBackend(t, ca, WithRefresh(refresh))
	defer a.Close()
	d := spendingDemand(10000, 24*time.Hour)
	d.Budgets[0].Seen, d.Budgets[0].Server = 1, 0
	la := joinLane(t, a, "api", d)
	time.Sleep(5 * refresh)
	g := added(la.since(time.Time{}))
	t.Logf("first budget call failed: %v; granted %.0f after a server count of 0", f.failed.Load(), g)
	if g > 1 {
		t.Errorf("granted %.0f of a budget the server said was empty: the count was lost with the failed call", g)
	}
}

// waitGranted waits up to 3s for l to have been granted want of its
// budget in all.
func waitGranted(t *testing.T, l *shareLane, want float64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for added(l.since(time.Time{})) < want {
		if time.Now().After(deadline) {
			t.Fatalf("lane granted %.0f, want %.0f", added(l.since(time.Time{})), want)
		}
		time.Sleep(time.Millisecond)
	}
}
