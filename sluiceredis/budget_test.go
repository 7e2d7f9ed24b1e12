package sluiceredis

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestBudgetDeadProcess: budget.lua grants by want within the fleet's
// level, and a process whose entry expired (it died) gives back what it
// held, and its unanswered costs stop lowering the level a server count
// sets.
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
	// a is gone: its 6,000 come back, and its unanswered 3,000 no longer
	// count (b's own entry expired too; it holds what it says).
	near("b, after a's lease, wanting 2,000 more", run("b", 1000, 2000, 0, -1), 2000)
	near("b, with a server count of 10,000 after a's lease", run("b", 3000, 8000, 0, 10000), 7000)
}
