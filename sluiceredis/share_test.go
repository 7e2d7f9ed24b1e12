package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
)

func TestWithRefreshValidated(t *testing.T) {
	c := newClient(t, "127.0.0.1:1")
	for _, d := range []time.Duration{0, -time.Second, 9 * time.Millisecond, time.Minute + 1} {
		_, err := New(c, WithRefresh(d))
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "WithRefresh("+d.String()+")") ||
			!strings.HasPrefix(err.Error(), "sluiceredis: ") {
			t.Errorf("WithRefresh(%v): %v", d, err)
		}
	}
	for _, d := range []time.Duration{10 * time.Millisecond, DefaultRefresh, time.Minute} {
		if _, err := New(c, WithRefresh(d)); err != nil {
			t.Errorf("WithRefresh(%v): %v", d, err)
		}
	}
	if _, err := NewTokens(c, WithRefresh(time.Second)); !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "WithRefresh") {
		t.Errorf("NewTokens(WithRefresh): %v, want ErrInvalidOption naming WithRefresh", err)
	}
}

func TestApportion(t *testing.T) {
	for _, tc := range []struct {
		c     float64
		wants [][levels]float64
		low   int
		want  []float64
	}{
		// The higher level first, whatever the lower one wants.
		{100, [][levels]float64{{40, 0, 0}, {0, 0, 500}, {0, 0, 500}, {0, 0, 500}}, 0, []float64{40, 20, 20, 20}},
		{100, [][levels]float64{{40, 0, 0}, {0, 0, 500}, {0, 0, 500}, {0, 0, 500}}, 10, []float64{40, 20, 20, 20}},
		// Max-min within a level: the small want is met, the others split.
		{100, [][levels]float64{{0, 0, 10}, {0, 0, 500}, {0, 0, 500}}, 10, []float64{10, 45, 45}},
		// A level that wants more than everything takes everything.
		{100, [][levels]float64{{150, 0, 0}, {0, 0, 500}}, 0, []float64{100, 0}},
		// ... less the low share, while a lower level wants.
		{100, [][levels]float64{{150, 0, 0}, {0, 0, 500}}, 10, []float64{90, 10}},
		{100, [][levels]float64{{150, 0, 0}, {0, 0, 5}}, 10, []float64{95, 5}},
		// ... shared by the levels below, in equal parts, what one does
		// not want going to the other.
		{100, [][levels]float64{{150, 0, 0}, {0, 150, 0}, {0, 0, 150}}, 10, []float64{90, 5, 5}},
		{100, [][levels]float64{{150, 0, 0}, {0, 2, 0}, {0, 0, 150}}, 10, []float64{90, 2, 8}},
		{100, [][levels]float64{{150, 0, 0}, {0, 0, 500}, {0, 0, 500}}, 4, []float64{75, 12.5, 12.5}},
		// What nobody wants is spread evenly.
		{100, [][levels]float64{{10, 0, 0}, {0, 20, 0}, {0, 0, 0}}, 10, []float64{10 + 70.0/3, 20 + 70.0/3, 70.0 / 3}},
		{100, nil, 10, []float64{}},
	} {
		got := apportion(tc.c, tc.wants, tc.low)
		for i := range tc.want {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("apportion(%v, %v, %d) = %v, want %v", tc.c, tc.wants, tc.low, got, tc.want)
				break
			}
		}
	}
	if got := apportionWhole(2, [][levels]int{{0, 0, 1}, {0, 0, 1}, {1, 0, 0}, {0, 0, 1}}); fmt.Sprint(got) != "[1 0 1 0]" {
		t.Errorf("apportionWhole(2, ...) = %v, want [1 0 1 0]: the Interactive place first", got)
	}
	if got := apportionWhole(5, [][levels]int{{0, 0, 9}, {0, 0, 1}}); fmt.Sprint(got) != "[4 1]" {
		t.Errorf("apportionWhole(5, ...) = %v, want [4 1]", got)
	}
}

// FuzzApportion checks apportion's contract: the parts add up to the
// capacity, none is negative; with strict priority, no part at a level is
// given while a higher level's want somewhere is unmet; with a low share,
// each level that wants below another gets its part of it.
func FuzzApportion(f *testing.F) {
	f.Add(100.0, 40.0, 500.0, 30.0, 0.0, 30.0, uint8(0))
	f.Add(100.0, 400.0, 500.0, 30.0, 0.0, 30.0, uint8(10))
	f.Fuzz(func(t *testing.T, c, a0, a2, b0, b1, b2 float64, low uint8) {
		for _, x := range []float64{c, a0, a2, b0, b1, b2} {
			if !(x >= 0 && x < 1e9) {
				return
			}
		}
		lowShare := int(low % 12)
		if lowShare == 1 {
			lowShare = 0
		}
		wants := [][levels]float64{{a0, 0, a2}, {b0, b1, b2}}
		got := apportion(c, wants, lowShare)
		sum := 0.0
		for _, g := range got {
			if g < 0 {
				t.Fatalf("negative part: %v", got)
			}
			sum += g
		}
		if c > 0 && math.Abs(sum-c) > 1e-6*max(c, 1) {
			t.Fatalf("apportion(%v, %v) = %v: adds up to %v", c, wants, got, sum)
		}
		if lowShare > 0 {
			// Each of the k levels below the highest that wants is owed
			// min(c/lowShare/k, its wants).
			low := lowLevels(wants)
			for _, l := range low {
				owed := min(c/float64(lowShare)/float64(len(low)), wants[0][l]+wants[1][l])
				if atLow := min(got[0], wants[0][l]) + min(got[1], wants[1][l]); atLow < owed-1e-6*max(c, 1) {
					t.Fatalf("apportion(%v, %v, %d) = %v: level %d got %v of the %v it is owed", c, wants, lowShare, got, l, atLow, owed)
				}
			}
			return
		}
		// Level 0's wants are met in full, or take everything.
		if a0+b0 <= c {
			if got[0] < a0-1e-6*max(c, 1) || got[1] < b0-1e-6*max(c, 1) {
				t.Fatalf("apportion(%v, %v) = %v: an Interactive want unmet", c, wants, got)
			}
		} else if got[0] > max(a0, c/2)+1e-6*max(c, 1) && got[1] > max(b0, c/2)+1e-6*max(c, 1) {
			t.Fatalf("apportion(%v, %v) = %v: more than level 0 wants while it is short", c, wants, got)
		}
	})
}

// shareLane stands for a lane: a fixed demand, and every share granted.
type shareLane struct {
	mu     sync.Mutex
	d      sluice.Demand
	gone   bool
	grants []grantAt
}

type grantAt struct {
	at time.Time
	s  sluice.Share
}

func (l *shareLane) demand() (sluice.Demand, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.d, !l.gone
}

func (l *shareLane) grant(s sluice.Share) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grants = append(l.grants, grantAt{time.Now(), s})
}

// last returns the latest grant, and its time.
func (l *shareLane) last() grantAt {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.grants) == 0 {
		return grantAt{}
	}
	return l.grants[len(l.grants)-1]
}

func (l *shareLane) since(t time.Time) []grantAt {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []grantAt
	for _, g := range l.grants {
		if g.at.After(t) {
			out = append(out, g)
		}
	}
	return out
}

func joinLane(t *testing.T, b *Backend, key string, d sluice.Demand) *shareLane {
	t.Helper()
	l := &shareLane{d: d}
	if !b.Join(key, l.demand, l.grant) {
		t.Fatal("Join declined")
	}
	return l
}

// waitShare waits up to 3s for l's latest share to be within 1% of want.
func waitShare(t *testing.T, l *shareLane, want float64, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		g := l.last()
		if len(l.since(time.Time{})) > 0 && math.Abs(g.s.Rate-want) <= 0.01*want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: share %v, want %v", what, g.s.Rate, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var (
	interactive8 = sluice.Demand{Rate: 100, Burst: 4, Waiting: [3]int{8, 0, 0}}
	batch100     = sluice.Demand{Rate: 100, Burst: 4, Waiting: [3]int{0, 0, 100}}
)

// TestSharesOutage: Redis goes away. Each process keeps its last share
// until its lease ends, then falls back to the rate over the processes it
// last knew of; once Redis is back it has a leased share again within a
// refresh, and the shares by priority within a few.
func TestSharesOutage(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	var lg logs
	opts := []Option{WithRefresh(refresh), WithTimeout(DefaultTimeout), WithLogger(slog.New(&lg))}
	a := newBackend(t, newClient(t, srv.Addr()), opts...)
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh), WithTimeout(DefaultTimeout))
	defer a.Close()
	defer b.Close()
	// Interactive: 8 waiting, to be served within two refreshes, is 40/s.
	la := joinLane(t, a, "api", interactive8)
	lb := joinLane(t, b, "api", batch100)
	waitShare(t, la, 40, "interactive")
	waitShare(t, lb, 60, "batch")

	down := time.Now()
	srv.Stop()
	time.Sleep(time.Second)
	for _, l := range []*shareLane{la, lb} {
		gs := l.since(down)
		// A refresh Redis answered as it stopped may land just after down:
		// a leased share still, not one the outage caused.
		for len(gs) > 0 && gs[0].at.Sub(down) < 50*time.Millisecond && (gs[0].s.Rate < 0.95*50-1e-9 || gs[0].s.Rate > 50) {
			gs = gs[1:]
		}
		if len(gs) == 0 {
			t.Fatal("no fallback share within a second of the outage")
		}
		// The lease (3 refreshes from the last refresh sent, at most a
		// refresh and a tenth before the outage) is kept.
		if d := gs[0].at.Sub(down); d < shareLeases*refresh-refresh*11/10-10*time.Millisecond {
			t.Errorf("the leased share was replaced %v after Redis went away, before its lease ended", d)
		}
		for _, g := range gs {
			if g.s.Rate < 0.95*50-1e-9 || g.s.Rate > 50 {
				t.Errorf("fallback share %v, want 95-100%% of 100/s over 2 processes", g.s.Rate)
			}
		}
	}
	if n := lg.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings logged for one outage of one key", n)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for lg.count(slog.LevelInfo) == 0 {
		if time.Since(back) > refresh*11/10+DefaultTimeout+100*time.Millisecond {
			t.Fatalf("no leased share %v after Redis came back (refresh %v)", time.Since(back), refresh)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("leased again %v after Redis came back", time.Since(back))
	waitShare(t, la, 40, "interactive after the outage")
	waitShare(t, lb, 60, "batch after the outage")
}

// TestSharesFirstAfterAFailedCall: process b loses Redis, its entry
// expires on Redis's clock, and it falls back to half the rate; process
// a's calls fail too, for less than its lease. Redis, which no longer
// knows of b, would grant a the whole rate at a's first answered refresh
// while b still sends at its fallback rate: a takes no more than the half
// it held until b is back.
func TestSharesFirstAfterAFailedCall(t *testing.T) {
	const refresh = 200 * time.Millisecond
	srv := startRedis(t)
	ca, cb := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	cutA, cutB := cutCalls(ca), cutCalls(cb)
	var lg logs
	a := newBackend(t, ca, WithRefresh(refresh), WithLogger(slog.New(&lg)))
	b := newBackend(t, cb, WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	la, lb := joinLane(t, a, "api", batch100), joinLane(t, b, "api", batch100)
	waitShare(t, la, 50, "a")
	waitShare(t, lb, 50, "b")

	// b's last call is sent before cut, so its entry expires by cut plus
	// a lease (600ms). a's last call is sent after cut plus 280ms (a
	// refresh and a tenth before its calls fail), so its lease outlasts
	// its calls' failures, from cut plus 500ms to 700ms.
	cut := time.Now()
	cutB.cut.Store(true)
	time.Sleep(shareLeases*refresh - refresh/2)
	cutA.cut.Store(true)
	time.Sleep(refresh)
	// On a loaded runner a's refresh may come late: hold the cut until
	// one of a's calls has failed, which is what this test is about.
	for cutA.failed.Load() == 0 {
		if time.Since(cut) > 10*refresh {
			t.Fatalf("no call of a failed %v after its calls were cut", time.Since(cut))
		}
		time.Sleep(5 * time.Millisecond)
	}
	back := time.Now()
	cutA.cut.Store(false)
	for len(la.since(back)) == 0 {
		if time.Since(back) > 2*refresh {
			t.Fatalf("no share for a %v after its calls were answered again", time.Since(back))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := newClient(t, srv.Addr()).HLen(context.Background(), newKeys(DefaultPrefix, "api").shares()).Val(); n != 1 {
		t.Fatalf("%d entries once a was answered again, want a's alone (b's expired)", n)
	}
	if lg.count(slog.LevelWarn) > 0 {
		t.Log("a fell back too (a late runner): its first share is bounded by its fallback's rate")
	}
	time.Sleep(refresh / 2)
	for _, c := range []struct {
		l    *shareLane
		what string
	}{{la, "a"}, {lb, "b"}} {
		for _, g := range c.l.since(cut) {
			if g.s.Rate > 50+1e-9 {
				t.Errorf("%s: share %v %v after b's calls were cut, over the 50 it held", c.what, g.s.Rate, g.at.Sub(cut).Round(time.Millisecond))
			}
		}
	}
	cutB.cut.Store(false)
	waitShare(t, lb, 50, "b, answered again")
	waitShare(t, la, 50, "a, beside b")
}

// putEntry writes a process's entry among the shares of key "api", its
// lease ending a second from now on Redis's clock; fields are the entry's
// after its expiry (see share.lua).
func putEntry(t *testing.T, c *redis.Client, id, fields string) {
	t.Helper()
	ctx := context.Background()
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	c.HSet(ctx, newKeys(DefaultPrefix, "api").shares(), id, fmt.Sprintf("%d %s", tm.Add(time.Second).UnixMicro(), fields))
}

// TestSharesDeadProcess: a process that dies holds its share until its
// lease ends, and not after.
func TestSharesDeadProcess(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	// A dead process's entry: it held 70/s, and its lease ends in 1s.
	putEntry(t, c, "dead", "100 4 0 70 -1 0 0 500 0 0 0")
	a := newBackend(t, c, WithRefresh(refresh))
	defer a.Close()
	l := joinLane(t, a, "api", batch100)
	start := time.Now()
	waitShare(t, l, 30, "beside a dead process's lease")
	waitShare(t, l, 100, "after the dead process's lease ended")
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("the dead process's share was taken %v after, before its lease ended (1s)", d)
	}
}

// TestSharesInFlight: with WithInFlight, places in flight are shared too,
// Interactive first, and the places granted never add up to more than the
// cap.
func TestSharesInFlight(t *testing.T) {
	const refresh = 50 * time.Millisecond
	srv := startRedis(t)
	opts := []Option{WithRefresh(refresh), WithInFlight(4, 30*time.Second)}
	a := newBackend(t, newClient(t, srv.Addr()), opts...)
	b := newBackend(t, newClient(t, srv.Addr()), opts...)
	defer a.Close()
	defer b.Close()
	la := joinLane(t, a, "api", sluice.Demand{Rate: 100, Burst: 4, Waiting: [3]int{3, 0, 0}})
	lb := joinLane(t, b, "api", batch100)
	deadline := time.Now().Add(3 * time.Second)
	for la.last().s.InFlight != 3 || lb.last().s.InFlight != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("places: interactive %d, batch %d; want 3 and 1", la.last().s.InFlight, lb.last().s.InFlight)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The Interactive queue drains: its places go to the Batch process.
	la.mu.Lock()
	la.d.Waiting = [3]int{}
	la.mu.Unlock()
	for la.last().s.InFlight != 0 || lb.last().s.InFlight != 4 {
		if time.Now().After(deadline.Add(2 * time.Second)) {
			t.Fatalf("places after: interactive %d, batch %d; want 0 and 4", la.last().s.InFlight, lb.last().s.InFlight)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// At no instant did the places granted add up to more than 4. A share
	// that shrinks is given up in Redis when its call runs, and reaches the
	// process a round trip later (the slack the package doc states): a
	// smaller grant received within a refresh after an instant counts from
	// that instant.
	ga, gb := la.since(time.Time{}), lb.since(time.Time{})
	for _, g := range append(ga, gb...) {
		held := 0
		for _, gs := range [][]grantAt{ga, gb} {
			held += int(heldAt(gs, g.at, refresh, func(s sluice.Share) float64 { return float64(s.InFlight) }))
		}
		if held > 4 {
			t.Fatalf("%d places granted at %v, over the cap of 4", held, g.at)
		}
	}
}

// TestSharesFreeze: a Redis frozen for longer than a lease (SIGSTOP) sends
// the processes to their fallback shares after their leases, and back to
// leased shares, by priority, after it resumes.
func TestSharesFreeze(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	opts := []Option{WithRefresh(refresh), WithTimeout(DefaultTimeout)}
	a := newBackend(t, newClient(t, srv.Addr()), opts...)
	b := newBackend(t, newClient(t, srv.Addr()), opts...)
	defer a.Close()
	defer b.Close()
	la := joinLane(t, a, "api", interactive8)
	lb := joinLane(t, b, "api", batch100)
	waitShare(t, la, 40, "interactive")
	waitShare(t, lb, 60, "batch")
	frozen := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	for _, l := range []*shareLane{la, lb} {
		var fell bool
		for _, g := range l.since(frozen) {
			if g.at.After(resumed) {
				break
			}
			fell = true
			if g.s.Rate < 0.95*50-1e-9 || g.s.Rate > 50 {
				t.Errorf("share %v while Redis was frozen, want the fallback's 47.5-50", g.s.Rate)
			}
		}
		if !fell {
			t.Error("no fallback share in 2s of a frozen Redis (lease 300ms)")
		}
	}
	waitShare(t, la, 40, "interactive after the freeze")
	waitShare(t, lb, 60, "batch after the freeze")
	t.Logf("shares by priority again %v after Redis resumed", time.Since(resumed).Round(time.Millisecond))
}

// TestSharesManyKeys: 200 keys behind a Redis 5ms away each way all get
// their first share within a refresh, and keep being refreshed on time.
func TestSharesManyKeys(t *testing.T) {
	const (
		refresh = 500 * time.Millisecond
		n       = 200
	)
	srv := startRedis(t)
	p := startDelayProxy(t, srv.Addr(), 5*time.Millisecond)
	b := newBackend(t, newClient(t, p.addr()), WithRefresh(refresh), WithTimeout(time.Second))
	defer b.Close()
	start := time.Now()
	lanes := make([]*shareLane, n)
	for i := range lanes {
		lanes[i] = joinLane(t, b, fmt.Sprintf("api-%d", i), batch100)
	}
	time.Sleep(3 * refresh)
	for i, l := range lanes {
		gs := l.since(start)
		if len(gs) == 0 {
			t.Fatalf("key %d: no share in %v", i, 3*refresh)
		}
		if d := gs[0].at.Sub(start); d > refresh {
			t.Errorf("key %d: first share %v after joining, more than a refresh (%v)", i, d, refresh)
		}
		// Refreshes every 0.9-1.1 refresh: at least 2 in 3 refreshes.
		if len(gs) < 3 {
			t.Errorf("key %d: %d shares in %v with a refresh of %v", i, len(gs), 3*refresh, refresh)
		}
	}
}

// TestSharesAfterEntryLost: Redis loses a process's entry (it restarted
// empty, or the entry expired in an outage) and the entry's versions
// start again from 1. The process takes the shares Redis grants it from
// then on, though it held a higher version: a process up for a day holds
// one near 86,400 at the default refresh.
func TestSharesAfterEntryLost(t *testing.T) {
	const refresh = 50 * time.Millisecond
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	a := newBackend(t, c, WithRefresh(refresh))
	defer a.Close()
	// A's entry as a long uptime leaves it.
	putEntry(t, c, a.self, "100 4 0 100 -1 0 0 100 0 0 0 1000000")
	la := joinLane(t, a, "api", batch100)
	waitShare(t, la, 100, "alone")
	if err := c.Del(context.Background(), newKeys(DefaultPrefix, "api").shares()).Err(); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer b.Close()
	lb := joinLane(t, b, "api", batch100)
	waitShare(t, lb, 50, "the second process, after the first's entry was lost")
	waitShare(t, la, 50, "the first process, after its entry was lost")
}

// TestSharesAfterRedisLosesThem: Redis loses every entry of a key
// (FLUSHALL, a restart quick enough for no call to fail, an eviction)
// while three processes each hold a third of 100/s. Redis, which knows of
// no one else, would grant the first process to refresh the whole rate
// while the other two still send at their thirds until their own
// refreshes: that process finds its entry lost, and no process is granted
// more than it holds until their leases have ended (see share.lua). The
// shares held never add up to more than the rate.
func TestSharesAfterRedisLosesThem(t *testing.T) {
	const refresh = 200 * time.Millisecond
	srv := startRedis(t)
	var lanes []*shareLane
	for range 3 {
		b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
		defer b.Close()
		lanes = append(lanes, joinLane(t, b, "api", batch100))
	}
	for i, l := range lanes {
		waitShare(t, l, 100.0/3, "before Redis lost the entries, "+string(rune('a'+i)))
	}
	time.Sleep(refresh)
	flushed := time.Now()
	if err := newClient(t, srv.Addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * refresh)
	for i, l := range lanes {
		waitShare(t, l, 100.0/3, "after Redis lost the entries, "+string(rune('a'+i)))
	}
	most, at := sharesHeld(lanes, flushed, 20*time.Millisecond)
	t.Logf("most held at once after Redis lost the entries: %.1f/s, %v after; over the rate for %v", most,
		at.Sub(flushed).Round(time.Millisecond), overFor(lanes, flushed, 100).Round(time.Millisecond))
	if most > 100*1.01 {
		t.Errorf("the shares held added up to %.1f/s at once, %v after Redis lost the entries: over the rate of 100/s",
			most, at.Sub(flushed).Round(time.Millisecond))
	}
}

// sharesHeld returns the most that lanes' grants add up to at any instant
// (one of the grants' times) after from: each lane's latest grant at or
// before the instant, or a smaller one it received within rtt after it
// (given up in Redis at the instant, it reaches the process a round trip
// later).
func sharesHeld(lanes []*shareLane, from time.Time, rtt time.Duration) (float64, time.Time) {
	var gs [][]grantAt
	for _, l := range lanes {
		gs = append(gs, l.since(time.Time{}))
	}
	most, when := 0.0, time.Time{}
	for _, own := range gs {
		for _, g := range own {
			if g.at.Before(from) {
				continue
			}
			sum := 0.0
			for _, other := range gs {
				sum += heldAt(other, g.at, rtt, func(s sluice.Share) float64 { return s.Rate })
			}
			if sum > most {
				most, when = sum, g.at
			}
		}
	}
	return most, when
}

// heldAt returns what of a share (of) a lane held at the instant at, from
// its grants gs: the latest at or before it, or a smaller one received
// within lag after it (given up in Redis at the instant, it reaches the
// process a round trip later); 0 before the first.
func heldAt(gs []grantAt, at time.Time, lag time.Duration, of func(sluice.Share) float64) float64 {
	last := -1
	for k, h := range gs {
		if !h.at.After(at) {
			last = k
		}
	}
	if last < 0 {
		return 0
	}
	v := of(gs[last].s)
	for _, h := range gs[last+1:] {
		if h.at.Sub(at) > lag {
			break
		}
		v = min(v, of(h.s))
	}
	return v
}

// overFor returns how long after from the lanes' latest grants added up to
// more than limit.
func overFor(lanes []*shareLane, from time.Time, limit float64) time.Duration {
	var all []time.Time
	for _, l := range lanes {
		for _, g := range l.since(from) {
			all = append(all, g.at)
		}
	}
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	var over time.Duration
	for k, at := range all {
		sum := 0.0
		for _, l := range lanes {
			var r float64
			for _, g := range l.since(time.Time{}) {
				if !g.at.After(at) {
					r = g.s.Rate
				}
			}
			sum += r
		}
		if sum > limit*1.01 && k+1 < len(all) {
			over += all[k+1].Sub(at)
		}
	}
	return over
}

// TestShareRecovery drives share.lua by hand: a process whose entry Redis
// lost starts the recovery for a lease, in which no process is granted
// more than it holds, one that held nothing is granted nothing, and rate
// nobody holds is not handed out. Once it ends, shares move again.
func TestShareRecovery(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	k := newKeys(DefaultPrefix, "api")
	const lease = 10 * time.Second
	batch := [levels]float64{0, 0, 500}
	ask := func(id string, w [levels]float64, held heldShare) shareReply {
		t.Helper()
		r, err := runShare(ctx, c, [3]string{k.shares(), k[1], k.recovery()}, shareArgs{
			self: id, lease: lease, rate: 100, burst: 4, wants: w, most: -1, channel: k.moved(), held: held,
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	held := func(r shareReply) heldShare { return heldShare{seq: r.seq, rate: r.rate, places: -1} }
	granted := func(id string) string {
		f := strings.Fields(c.HGet(ctx, k.shares(), id).Val())
		if len(f) != 13 {
			t.Fatalf("%s's entry %v", id, f)
		}
		return f[4]
	}
	// a and b hold half each.
	ask("a", batch, heldShare{})
	ask("b", batch, heldShare{})
	ra := ask("a", batch, heldShare{})
	rb := ask("b", batch, heldShare{})
	if ra.rate != 50 || rb.rate != 50 {
		t.Fatalf("a %v and b %v, want 50 each", ra.rate, rb.rate)
	}
	if n := c.Exists(ctx, k.recovery()).Val(); n != 0 {
		t.Fatal("the recovery started with no entry lost")
	}

	if err := c.Del(ctx, k.shares()).Err(); err != nil {
		t.Fatal(err)
	}
	// a finds its entry lost: it keeps its half, not the whole rate, for a
	// lease.
	if r := ask("a", batch, held(ra)); r.rate != 50 {
		t.Errorf("a got %v after its entry was lost, want the 50 it held", r.rate)
	}
	if d := c.PTTL(ctx, k.recovery()).Val(); d < lease-time.Second || d > lease {
		t.Errorf("the recovery lasts %v, want a lease (%v)", d, lease)
	}
	// b finds its entry lost too: its half, which Redis did not know of, is
	// still its own.
	if r := ask("b", batch, held(rb)); r.rate != 50 {
		t.Errorf("b got %v after its entry was lost, want the 50 it held", r.rate)
	}
	// c, new, finds nobody's rate free; then a gives up 40 of c's part,
	// which goes to nobody, and c, holding nothing, is granted none of it.
	if r := ask("c", batch, heldShare{}); r.rate != 0 {
		t.Errorf("c got %v beside a's and b's halves", r.rate)
	}
	ask("a", [levels]float64{10, 0, 0}, held(ra))
	if g := granted("c"); g != "0" {
		t.Errorf("c's entry holds %s during the recovery: the rate a gave up was handed out", g)
	}
	if r := ask("c", batch, heldShare{seq: 1}); r.rate != 0 {
		t.Errorf("c got %v during the recovery, holding nothing", r.rate)
	}

	// The recovery over, c is granted what a gave up.
	if err := c.Del(ctx, k.recovery()).Err(); err != nil {
		t.Fatal(err)
	}
	if r := ask("c", batch, heldShare{seq: 1}); r.rate != 40 {
		t.Errorf("c got %v once the recovery ended, want the 40 nobody holds", r.rate)
	}
}

// TestSharesLowShareBelow: one process's Interactive calls want the whole
// rate while a second process's Normal calls and a third's Batch calls
// wait. The two below share the tenth that WithLowShare keeps from the
// Interactive level; the Normal level does not starve.
func TestSharesLowShareBelow(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	var lanes [3]*shareLane
	for p := range lanes {
		b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
		defer b.Close()
		d := sluice.Demand{Rate: 100, Burst: 4, LowShare: 10}
		d.Waiting[p] = 1000
		lanes[p] = joinLane(t, b, "api", d)
	}
	waitShare(t, lanes[sluice.Interactive], 90, "interactive")
	waitShare(t, lanes[sluice.Normal], 5, "normal, beside interactive and batch")
	waitShare(t, lanes[sluice.Batch], 5, "batch, beside interactive and normal")
}

// apportionWholeStepwise is apportionWhole's rule taken literally, one
// unit at a time: the reference FuzzApportionWhole holds it to.
func apportionWholeStepwise(c int, wants [][levels]int) []int {
	give := make([]int, len(wants))
	if len(wants) == 0 || c <= 0 {
		return give
	}
	left := c
	at := make([]int, len(wants))
	for l := range levels {
		clear(at)
		for left > 0 {
			best := -1
			for i, w := range wants {
				if w[l]-at[i] >= 1 && (best < 0 || at[i] < at[best]) {
					best = i
				}
			}
			if best < 0 {
				break
			}
			at[best]++
			give[best]++
			left--
		}
	}
	for ; left > 0; left-- {
		best := 0
		for i := range give {
			if give[i] < give[best] {
				best = i
			}
		}
		give[best]++
	}
	return give
}

// FuzzApportionWhole: apportionWhole, which computes its outcome at once,
// gives what handing out one unit at a time gives.
func FuzzApportionWhole(f *testing.F) {
	f.Add(uint16(10), []byte{1, 0, 9, 0, 0, 1, 1, 0, 0})
	f.Add(uint16(500), []byte{40, 3, 0, 0, 200, 7, 5, 5, 5, 0, 0, 0})
	f.Fuzz(func(t *testing.T, c uint16, b []byte) {
		if len(b) > 8*levels {
			b = b[:8*levels]
		}
		wants := make([][levels]int, len(b)/levels)
		for i := range wants {
			for l := range levels {
				wants[i][l] = int(b[i*levels+l]) - 8 // a few negative
			}
		}
		got, want := apportionWhole(int(c), wants), apportionWholeStepwise(int(c), wants)
		if !slices.Equal(got, want) {
			t.Fatalf("apportionWhole(%d, %v) = %v, one unit at a time gives %v", c, wants, got, want)
		}
	})
}

// TestSharesLargeInFlightCap: a cap of a million places in flight, shared
// by ten processes, is apportioned within the default timeout, as a cap
// of four is: the script's time does not grow with the cap.
func TestSharesLargeInFlightCap(t *testing.T) {
	const (
		refresh = 100 * time.Millisecond
		procs   = 10
		places  = 1_000_000
	)
	srv := startRedis(t)
	var lanes []*shareLane
	for i := range procs {
		b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh), WithInFlight(places, 30*time.Second))
		defer b.Close()
		d := sluice.Demand{Rate: 100, Burst: 4}
		d.Waiting[sluice.Batch] = 1000 * (i + 1)
		lanes = append(lanes, joinLane(t, b, "api", d))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		sum, granted := 0, 0
		for _, l := range lanes {
			if n := l.last().s.InFlight; n > 0 {
				sum += n
				granted++
			}
		}
		if granted == procs && sum == places {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d processes granted places, %d of %d in all, 5 s after they joined", granted, procs, sum, places)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSharesOutageCalls: while Redis does not answer for a key, the key is
// tried again four times a refresh for twice its lease after its call
// failed, so that a failover is caught soon, and then once a refresh: a
// long outage costs Redis no more calls than a refresh each.
func TestSharesOutageCalls(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newBackend(t, c, WithRefresh(refresh), WithTimeout(10*time.Millisecond))
	defer b.Close()
	l := joinLane(t, b, "api", batch100)
	waitShare(t, l, 100, "alone")
	n := countCalls(c)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	const outage = 3 * time.Second // 30 refreshes
	time.Sleep(outage)
	calls := n.n.Load()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls in an outage of %v at a refresh of %v", calls, outage, refresh)
	// Four a refresh for six refreshes, then one: about 80 calls here,
	// with the calls around them; four a refresh throughout made 151.
	if calls > 110 {
		t.Errorf("%d calls to an unanswering Redis in %v at a refresh of %v, want about one a refresh", calls, outage, refresh)
	}
}
