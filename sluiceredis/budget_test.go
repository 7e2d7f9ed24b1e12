package sluiceredis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// TestBudgetDeadProcess: budget.lua grants by want within the fleet's
// level; a process whose entry expired (it died) gives back nothing of
// what it held, which it may have spent, and its unanswered costs stop
// lowering the level a server count sets.
func TestBudgetDeadProcess(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	key := []string{"t:{k}:budget:tokens"}
	const lease = 300 * time.Millisecond
	// One refresh of process id: it holds held, wants want more, has
	// unanswered costs of out; server < 0: no server count.
	run := func(id string, held, want, out, server float64) float64 {
		t.Helper()
		srvArg := ""
		if server >= 0 {
			srvArg = strconv.FormatFloat(server, 'g', -1, 64)
		}
		f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
		// 10,000 a day: nothing refills in the test's time.
		v, err := budgetScript.Run(ctx, c, key, id, lease.Microseconds(), time.Minute.Microseconds(),
			10000, f(10000.0/86400), f(held), 0, f(want), f(out), 0, srvArg).StringSlice()
		if err != nil || len(v) != 3 {
			t.Fatalf("budget.lua: %v %v", v, err)
		}
		g, _ := strconv.ParseFloat(v[0], 64)
		return g
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if got < want-1 || got > want+1 {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	near("the first process, wanting 6,000 of 10,000", run("a", 0, 6000, 3000, -1), 6000)
	near("the second, wanting 6,000 of the 4,000 left", run("b", 0, 6000, 0, -1), 4000)
	// A server count of 10,000 while a has 3,000 unanswered: the fleet
	// has 7,000, and a and b hold 10,000: b, refreshing, gives back 3,000.
	near("b, with a server count, wanting 2,000 more", run("b", 4000, 2000, 0, 10000), -3000)
	time.Sleep(lease + 100*time.Millisecond)
	// a is gone: it may have spent its 6,000 before it went, so they do
	// not come back (b's own entry expired too; it holds what it says).
	near("b, after a's lease, wanting 2,000 more", run("b", 1000, 2000, 0, -1), 0)
	// A server count says what is left: a's unanswered 3,000 no longer
	// count against it.
	near("b, with a server count of 10,000 after a's lease", run("b", 1000, 10000, 0, 10000), 9000)
}

// budgetDemand is a lane's demand of one budget of 60,000 a minute (1,000
// a second) with a queue that wants more than the budget.
func budgetDemand() sluice.Demand {
	d := batch100
	d.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: 60000, Per: time.Minute, Queued: [3]float64{0, 0, 1e6}, Need: 4000}}
	return d
}

// added sums the budget grants of gs.
func added(gs []grantAt) float64 {
	var sum float64
	for _, g := range gs {
		if len(g.s.Budgets) > 0 {
			sum += g.s.Budgets[0].Add
		}
	}
	return sum
}

// TestBudgetsLeased: two processes whose lanes want more than a budget
// (and spend at once what they are granted) are never granted more than it
// holds, its size and then its refill, and split the refill; while Redis
// is away, a process's lanes are granted its last part of the refill, so
// that they keep sending, and no more.
func TestBudgetsLeased(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	start := time.Now()
	la := joinLane(t, a, "api", budgetDemand())
	lb := joinLane(t, b, "api", budgetDemand())
	time.Sleep(time.Second)
	mid := time.Now()
	time.Sleep(time.Second)
	ga, gb := added(la.since(start)), added(lb.since(start))
	most := 60000 + 1000*time.Since(start).Seconds()
	t.Logf("granted in %v: %.0f and %.0f of 60,000 and the refill", time.Since(start).Round(time.Millisecond), ga, gb)
	if ga+gb > most {
		t.Errorf("granted %.0f in all, over the %.0f the budget held", ga+gb, most)
	}
	// The first to ask took the budget's 60,000; the refill is split.
	ra, rb := added(la.since(mid)), added(lb.since(mid))
	secs := time.Since(mid).Seconds()
	t.Logf("granted in the last %.1fs: %.0f and %.0f of the refill", secs, ra, rb)
	if ra < 0.3*1000*secs || rb < 0.3*1000*secs {
		t.Errorf("granted %.0f and %.0f of %.0f refilled: not split between the two", ra, rb, 1000*secs)
	}

	srv.Stop()
	down := time.Now()
	time.Sleep(time.Second + shareLeases*refresh)
	gone := time.Since(down).Seconds()
	fa, fb := added(la.since(down)), added(lb.since(down))
	t.Logf("granted in the %.1fs Redis was away: %.0f and %.0f", gone, fa, fb)
	// Each falls back to half the refill once its lease ends.
	for _, g := range []float64{fa, fb} {
		if g < 0.25*1000*(gone-shareLeases*refresh.Seconds()) || g > 0.5*1000*gone+1 {
			t.Errorf("granted %.0f while Redis was away, want about half the refill of %.1fs", g, gone-shareLeases*refresh.Seconds())
		}
	}
}
