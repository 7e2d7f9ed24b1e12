package sluiceredis

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
)

var (
	//go:embed budget.lua
	budgetSrc    string
	budgetScript = redis.NewScript(budgetSrc)
)

// budgetRefreshes: a lane asks for what its recent costs spend in this
// many refreshes, on top of its queue, so that it holds enough until the
// next refresh even if that one is late.
const budgetRefreshes = 2

// A laneBudget is what the refresher knows of one lane's budget between
// refreshes.
type laneBudget struct {
	spent float64   // the lane's Spent at the last refresh
	at    time.Time // of the last refresh; zero before the first
	est   float64   // its smoothed cost rate, units a second
	seen  uint64    // the server counts passed on
	// owed is what the lane gave back in calls whose answer did not come:
	// Redis may have taken it, so the lane no longer counts it, and gives
	// it up at its next grant.
	owed float64
	// share is the grant to hand the lane with its next share (see hand);
	// nil: none.
	share *sluice.BudgetShare
}

// budgetState is a shareKey's account of its budgets: what the lanes that
// went held, to give back at the next refresh, and the fleet's margin.
type budgetState struct {
	back   map[string]float64
	margin map[string]float64
	fell   time.Time // when the fallback last granted (see fallback); zero: not fallen
	// known are the budgets of the last refresh, for one made after the
	// key's last lane went, to give back what the lanes held.
	known []sluice.BudgetDemand
	// failed is since when the budgets' calls fail while the share's are
	// answered; zero: the last was answered.
	failed time.Time
	// fellGave is what the fallback granted since Redis last answered, by
	// budget: the fleet's level is charged for it at the first answer.
	fellGave map[string]float64
}

// budgetKey names the hash of budget name of key (see budget.lua), in the
// key's slot.
func budgetKey(k keys, name string) string {
	return k[0][:len(k[0])-len("tat")] + "budget:" + name
}

// refreshBudgets asks Redis for this process's part of sk's budgets, by
// what lanes (read at sent) want of them, and leaves each lane's grant in
// its laneBudget for hand. It does nothing for a key whose lanes have no
// budgets. On an error the lanes keep what they hold, and get nothing.
// With no lanes (the key's last went) it gives back what the lanes that
// went held, charges what the fallback granted them, and holds nothing
// from then on.
func (b *backend) refreshBudgets(ctx context.Context, sk *shareKey, lanes []*member, sent time.Time) error {
	var names []string
	var size []int
	var per []time.Duration
	// The budgets of every lane, by name: the lanes of several Transports
	// on the key may list them in other orders, or have others.
	from := func(ds []sluice.BudgetDemand) {
		for _, d := range ds {
			if !slices.Contains(names, d.Name) {
				names = append(names, d.Name)
				size = append(size, d.Size)
				per = append(per, d.Per)
			}
		}
	}
	for _, m := range lanes {
		from(m.now.Budgets)
	}
	if len(lanes) > 0 && len(names) > 0 {
		known := make([]sluice.BudgetDemand, len(names))
		for j := range names {
			known[j] = sluice.BudgetDemand{Name: names[j], Size: size[j], Per: per[j]}
		}
		sk.budgets.known = known
	}
	if len(lanes) == 0 {
		if len(sk.budgets.back) == 0 && len(sk.budgets.fellGave) == 0 {
			return nil
		}
		from(sk.budgets.known)
	}
	if len(names) == 0 {
		return nil
	}
	if sk.budgets.margin == nil {
		sk.budgets.margin = map[string]float64{}
	}
	bound := -1.0
	switch {
	case sk.fallen && sk.frac > 0:
		bound = sk.frac
	case sk.fallen || sk.failed > 0:
		bound = 1 / float64(max(sk.procs, 1))
	}
	type lanePart struct {
		ret, unmet, held float64
		lb               *laneBudget // nil: the lane has no such budget
		// was is lb before this call: a call that fails passes on nothing,
		// and the next passes on what this one would have (a server count
		// above all, which is passed on once).
		was laneBudget
	}
	parts := make([][]lanePart, len(lanes))
	k := newKeys(b.cfg.prefix, sk.key)
	rkeys := make([]string, len(names))
	args := []any{b.self, (shareLeases * b.cfg.refresh).Microseconds(), 0}
	f := func(x float64) string {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			x = 0 // never sent: budget.lua would keep it
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	keep := time.Duration(0)
	for j, name := range names {
		rkeys[j] = budgetKey(k, name)
		keep = max(keep, 2*per[j])
		margin := sk.budgets.margin[name]
		var held, back, want, unans, spent float64
		server, seen := math.Inf(1), false
		for i, m := range lanes {
			if parts[i] == nil {
				parts[i] = make([]lanePart, len(names))
			}
			kj := budgetIndex(m.now.Budgets, name)
			if kj < 0 {
				continue
			}
			d := m.now.Budgets[kj]
			for len(m.budgets) < len(m.now.Budgets) {
				m.budgets = append(m.budgets, laneBudget{spent: m.now.Budgets[len(m.budgets)].Spent})
			}
			lb := &m.budgets[kj]
			p := &parts[i][j]
			p.lb, p.was = lb, *lb
			level := d.Level - lb.owed
			elapsed := b.cfg.refresh
			if !lb.at.IsZero() {
				elapsed = max(sent.Sub(lb.at), time.Millisecond)
			}
			lb.at = sent
			ds := d.Spent - lb.spent
			lb.spent = d.Spent
			gain := 1 - math.Pow(1-estGain, min(elapsed.Seconds()/b.cfg.refresh.Seconds(), 1))
			lb.est += gain * (max(ds, 0)/elapsed.Seconds() - lb.est)
			spent += ds
			var queued float64
			for _, q := range d.Queued {
				queued += q
			}
			w := lb.est*budgetRefreshes*b.cfg.refresh.Seconds() + max(queued*(1+margin), d.Need) + margin*d.Unanswered
			p.ret = max(level-w, 0)
			p.held = level - p.ret
			p.unmet = max(w-level, 0)
			held += p.held
			back += p.ret
			want += p.unmet
			unans += d.Unanswered
			if d.Seen > lb.seen {
				lb.seen = d.Seen
				seen = true
				var others float64
				for k, o := range lanes {
					if ok := budgetIndex(o.now.Budgets, name); k != i && ok >= 0 {
						others += o.now.Budgets[ok].Unanswered
					}
				}
				server = min(server, d.Server-others)
			}
		}
		// What the lanes that went held, and what the fallback granted
		// meanwhile, which Redis never counted.
		back += sk.budgets.back[name] - sk.budgets.fellGave[name]
		if bound >= 0 {
			// The first call after failed ones: Redis may have lost the
			// others' entries (see shareKey.most), so no more than this
			// process's part of the size.
			want = min(want, max(0, bound*float64(size[j])-held))
		}
		srv := ""
		if seen && !math.IsNaN(server) && !math.IsInf(server, 0) {
			srv = f(server)
		}
		args = append(args, size[j], f(float64(size[j])/per[j].Seconds()), f(held), f(back), f(want), f(unans), f(spent), srv)
	}
	args[2] = keep.Microseconds()
	v, err := budgetScript.Run(ctx, b.client, rkeys, args...).StringSlice()
	if err == nil && len(v) != 3*len(names) {
		err = fmt.Errorf("sluiceredis: budget.lua returned %v", v)
	}
	var rs [][3]float64
	for j := range names {
		if err != nil {
			break
		}
		var r [3]float64
		for x := range r {
			if r[x], err = strconv.ParseFloat(v[3*j+x], 64); err != nil || math.IsNaN(r[x]) || math.IsInf(r[x], 0) {
				err = fmt.Errorf("sluiceredis: budget.lua returned %v", v)
				break
			}
		}
		rs = append(rs, r)
	}
	// What the lanes that went held is sent once: if Redis ran the call
	// and its answer was lost, sent again it would be given back twice.
	clear(sk.budgets.back)
	if err != nil {
		for i := range parts {
			for _, p := range parts[i] {
				if p.lb != nil {
					*p.lb = p.was
					p.lb.owed += p.ret
				}
			}
		}
		return err
	}
	clear(sk.budgets.fellGave)
	for j, name := range names {
		grant, flow, margin := rs[j][0], rs[j][1], min(max(rs[j][2], 0), 1)
		sk.budgets.margin[name] = margin
		var unmet, held float64
		for i := range lanes {
			unmet += parts[i][j].unmet
			held += max(parts[i][j].held, 0)
		}
		wants := make([][levels]float64, len(lanes))
		for i := range lanes {
			wants[i][0] = parts[i][j].unmet
		}
		var give []float64
		if grant > 0 {
			give = apportion(grant, wants, 0)
		}
		for i := range lanes {
			p := parts[i][j]
			if p.lb == nil {
				continue
			}
			p.lb.owed = 0
			s := sluice.BudgetShare{Add: -p.ret - p.was.owed, Rate: flow / float64(len(lanes)), Margin: margin}
			switch {
			case give != nil:
				s.Add += give[i]
			case grant < 0 && held > 0:
				s.Add += grant * max(p.held, 0) / held
			}
			if unmet > 0 {
				s.Rate = flow * p.unmet / unmet
			}
			p.lb.share = &s
		}
	}
	return nil
}

// budgetIndex returns the index of the budget named name in ds, or -1.
func budgetIndex(ds []sluice.BudgetDemand, name string) int {
	return slices.IndexFunc(ds, func(d sluice.BudgetDemand) bool { return d.Name == name })
}

// budgetShares takes the grants refreshBudgets left for m, indexed as its
// budgets; nil if none.
func (m *member) budgetShares() []sluice.BudgetShare {
	var ss []sluice.BudgetShare
	for j := range m.budgets {
		lb := &m.budgets[j]
		if lb.share == nil {
			continue
		}
		if ss == nil {
			ss = make([]sluice.BudgetShare, len(m.budgets))
			for k := range ss {
				ss[k].Rate, ss[k].Margin = -1, -1
			}
		}
		ss[j] = *lb.share
		lb.share = nil
	}
	return ss
}

// gone keeps what the budgets of a lane that went held when it went (d,
// its last demand: see sluice.Leaser), for sk to give back at its next
// refresh.
func (bs *budgetState) gone(d sluice.Demand) {
	for _, bd := range d.Budgets {
		if !(bd.Level > 0) || math.IsInf(bd.Level, 0) {
			continue
		}
		if bs.back == nil {
			bs.back = map[string]float64{}
		}
		bs.back[bd.Name] += bd.Level
	}
}

// fallback grants lanes, at now, their part of frac of each budget's
// refill since the last fallback grant (a refresh's worth at the first),
// as the fallback share of the rate (see fallbackShare): no lane holds
// more than frac of a budget's size.
func (bs *budgetState) fallback(lanes []*member, frac float64, now time.Time, refresh time.Duration) {
	elapsed := refresh
	if !bs.fell.IsZero() {
		elapsed = now.Sub(bs.fell)
	}
	bs.fell = now
	for _, m := range lanes {
		for j, d := range m.now.Budgets {
			if d.Per <= 0 {
				continue
			}
			for len(m.budgets) <= j {
				m.budgets = append(m.budgets, laneBudget{spent: d.Spent})
			}
			most := frac * float64(d.Size) / float64(len(lanes))
			add := min(frac*float64(d.Size)/d.Per.Seconds()*elapsed.Seconds()/float64(len(lanes)), most-d.Level)
			s := sluice.BudgetShare{Add: max(add, 0), Rate: frac * float64(d.Size) / d.Per.Seconds() / float64(len(lanes)), Margin: -1}
			m.budgets[j].share = &s
			if bs.fellGave == nil {
				bs.fellGave = map[string]float64{}
			}
			bs.fellGave[d.Name] += s.Add
		}
	}
}
