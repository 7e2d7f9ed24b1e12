package sluiceredis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// spendLane is a lane of one budget that wants far more than the budget
// allows, holds what it is granted and spends it at pace units a second.
type spendLane struct {
	mu    sync.Mutex
	base  sluice.Demand
	pace  float64
	at    time.Time
	level float64 // what it holds: its grants, less what it gave back and spent
	spent float64
}

func newSpendLane(size int, per time.Duration, pace float64) *spendLane {
	d := batch100
	d.Budgets = []sluice.BudgetDemand{{Name: "tokens", Size: size, Per: per, Queued: [3]float64{0, 0, 1e6}, Need: 100}}
	return &spendLane{base: d, pace: pace, at: time.Now()}
}

// spend spends, at now, what the pace allows since the last call of what
// the lane holds; l.mu is held.
func (l *spendLane) spend(now time.Time) {
	s := min(max(l.level, 0), l.pace*now.Sub(l.at).Seconds())
	l.level -= s
	l.spent += s
	l.at = now
}

func (l *spendLane) demand() (sluice.Demand, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spend(time.Now())
	d := l.base
	d.Budgets = append([]sluice.BudgetDemand(nil), l.base.Budgets...)
	d.Budgets[0].Level, d.Budgets[0].Spent = l.level, l.spent
	return d, true
}

func (l *spendLane) grant(s sluice.Share) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spend(time.Now())
	if len(s.Budgets) > 0 {
		l.level += s.Budgets[0].Add
	}
}

// read returns, at now, what the lane holds and has spent, and from then
// on spends at pace.
func (l *spendLane) read(now time.Time, pace float64) (level, spent float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spend(now)
	l.pace = pace
	return l.level, l.spent
}

// TestBudgetsAfterRedisLosesThem: three processes share 6,000 tokens a
// minute (100 a second) and want far more; Redis loses every key
// (FLUSHALL) mid-run, though no call fails. Redis then takes the budget as
// full, as at the fleet's first start, and knows of nothing the processes
// hold until they refresh: the fleet spends, over the window after the
// loss, what the budget allowed at the loss and its refill, plus the
// budget's size once, as a first start, and no more. It is shown with
// lanes that spend what they are granted at once (they hold nothing at
// the loss), and with lanes that hold it all until the loss and spend it
// then, before their next refresh tells Redis.
func TestBudgetsAfterRedisLosesThem(t *testing.T) {
	const (
		refresh = 100 * time.Millisecond
		size    = 6000
		per     = time.Minute
		rate    = size / 60.0
		window  = time.Second
		fast    = 1e9 // spends what it holds at once
	)
	for _, tc := range []struct {
		name string
		pace float64 // until the loss; fast from then on
	}{{"spending", fast}, {"holding", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRedis(t)
			var lanes []*spendLane
			for range 3 {
				b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
				defer b.Close()
				l := newSpendLane(size, per, tc.pace)
				if !b.Join("api", l.demand, l.grant) {
					t.Fatal("Join declined")
				}
				lanes = append(lanes, l)
			}
			fleet := func(pace float64) (held, spent float64) {
				now := time.Now()
				for _, l := range lanes {
					h, s := l.read(now, pace)
					held, spent = held+h, spent+s
				}
				return held, spent
			}
			started := time.Now()
			time.Sleep(window)
			h0, s0 := fleet(tc.pace)
			first := h0 + s0 // granted
			firstFor := time.Since(started)
			time.Sleep(window)

			lvl := levelOf(t, srv.Addr())
			if err := newClient(t, srv.Addr()).FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			lost := time.Now()
			held, spentAt := fleet(fast)
			time.Sleep(window)
			_, spentEnd := fleet(fast)
			w := time.Since(lost)
			spent := spentEnd - spentAt
			allow := max(lvl, 0) + held + rate*w.Seconds()
			t.Logf("the fleet's first %v: granted %.0f (%d and the refill)", firstFor.Round(time.Millisecond), first, size)
			t.Logf("at the loss the fleet held %.0f and %.0f was not granted; in the %v after it spent %.0f: the budget allowed %.0f, %.0f over (its size is %d)",
				held, max(lvl, 0), w.Round(time.Millisecond), spent, allow, spent-allow, size)
			if spent > allow+size+2*rate*refresh.Seconds() {
				t.Errorf("the fleet spent %.0f in the %v after Redis lost the budget: %.0f over the %.0f the budget allowed, more than its size (%d)",
					spent, w.Round(time.Millisecond), spent-allow, allow, size)
			}
		})
	}
}
