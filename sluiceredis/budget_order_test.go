package sluiceredis

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// addedNamed sums the grants of budget name in gs, whose demand d lists
// the lane's budgets (a grant is indexed as d.Budgets).
func addedNamed(gs []grantAt, d sluice.Demand, name string) float64 {
	var sum float64
	for _, g := range gs {
		for j, bs := range g.s.Budgets {
			if j < len(d.Budgets) && d.Budgets[j].Name == name {
				sum += bs.Add
			}
		}
	}
	return sum
}

// TestBudgetsListedInAnotherOrder: lanes of one key on one Backend list
// the budgets "tokens" and "input-tokens" in other orders, or one of them
// only, as Transports configured apart do. Each lane is granted each of
// its budgets, by name: a lane granted none of a budget would hold every
// request that costs some of it until its context ended.
func TestBudgetsListedInAnotherOrder(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer b.Close()
	tokens := sluice.BudgetDemand{Name: "tokens", Size: 60000, Per: time.Minute, Queued: [3]float64{0, 0, 1000}, Need: 1000}
	input := sluice.BudgetDemand{Name: "input-tokens", Size: 60000, Per: time.Minute, Queued: [3]float64{0, 0, 1000}, Need: 1000}
	d1, d2, d3 := batch100, batch100, batch100
	d1.Budgets = []sluice.BudgetDemand{tokens, input}
	d2.Budgets = []sluice.BudgetDemand{input, tokens}
	d3.Budgets = []sluice.BudgetDemand{input}
	l1 := joinLane(t, b, "api", d1)
	l2 := joinLane(t, b, "api", d2)
	l3 := joinLane(t, b, "api", d3)
	time.Sleep(5 * refresh)
	for _, c := range []struct {
		name string
		l    *shareLane
		d    sluice.Demand
	}{{"first", l1, d1}, {"second (other order)", l2, d2}, {"third (input-tokens only)", l3, d3}} {
		for _, bd := range c.d.Budgets {
			if g := addedNamed(c.l.since(time.Time{}), c.d, bd.Name); g < 1000 {
				t.Errorf("%s lane: granted %.0f of %q, wants 1,000 of a full budget of 60,000", c.name, g, bd.Name)
			}
		}
	}
}

// TestTransportsBudgetsInAnotherOrder: the same through two Transports on
// one Backend, the second listing its budgets in another order: the first
// request of each, which costs 100 tokens of a full budget of 60,000, is
// sent.
func TestTransportsBudgetsInAnotherOrder(t *testing.T) {
	srv := startRedis(t)
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(100*time.Millisecond))
	defer b.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	mk := func(names ...string) *sluice.Transport {
		opts := []sluice.Option{sluice.WithBackend(b), sluice.WithRate(100, time.Second)}
		for _, n := range names {
			opts = append(opts, sluice.WithBudget(n, 60000, time.Minute))
		}
		tr, err := sluice.New(nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	for i, tr := range []*sluice.Transport{mk("tokens", "input-tokens"), mk("input-tokens", "tokens")} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ctx = sluice.WithCost(sluice.WithCost(ctx, "tokens", 100), "input-tokens", 100)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.URL, nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		cancel()
		if err != nil {
			t.Errorf("Transport %d: %v after %v", i+1, err, time.Since(start).Round(time.Millisecond))
			continue
		}
		resp.Body.Close()
	}
}

// TestShareCooldownOutOfBounds: a key's cooldown holds a time no
// cool.lua writes (at most a day ahead), written by hand or by another
// tool, as TestTokensCooldownOutOfBounds has for Tokens. A Backend's lane
// is still leased its share, where every refresh failed on the reply and
// the lanes fell back for good, and is told of a cooldown of a day at
// most, not of centuries.
func TestShareCooldownOutOfBounds(t *testing.T) {
	const refresh = 100 * time.Millisecond
	for _, v := range []string{"1e16", "1e18"} {
		t.Run(v, func(t *testing.T) {
			srv := startRedis(t)
			c := newClient(t, srv.Addr())
			if err := c.Set(context.Background(), newKeys(DefaultPrefix, "api")[1], v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			a := newBackend(t, c, WithRefresh(refresh))
			defer a.Close()
			la := joinLane(t, a, "api", batch100)
			time.Sleep(3 * refresh)
			g := la.last()
			if g.s.Rate < 99 {
				t.Errorf("cooldown key %s: lane's share %v/s, want the key's 100/s (leased)", v, g.s.Rate)
			}
			if g.s.Cool.After(g.at.Add(maxCool + time.Second)) {
				t.Errorf("cooldown key %s: lane told to cool down until %v, %v from now (at most %v)", v, g.s.Cool, g.s.Cool.Sub(g.at), maxCool)
			}
		})
	}
}
