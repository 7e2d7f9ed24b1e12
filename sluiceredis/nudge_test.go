package sluiceredis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// TestShareMovesAtOnce drives share.lua by hand: a process owed a share
// others hold has them named on the key's channel, and the rate a refresh
// leaves unheld is granted in the same call to those owed it, who are sent
// their new rate and entry version; the entries never add up to more than
// the rate.
func TestShareMovesAtOnce(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	k := newKeys(DefaultPrefix, "api")
	ps := c.Subscribe(ctx, k.moved())
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	ask := func(id string, w [levels]float64) shareReply {
		t.Helper()
		r, err := runShare(ctx, c, [3]string{k.shares(), k[1], k.recovery()}, shareArgs{
			self: id, lease: 10 * time.Second, rate: 100, burst: 4, wants: w, most: -1, channel: k.moved(),
		})
		if err != nil {
			t.Fatal(err)
		}
		// The entries never hold more than the rate.
		var sum float64
		for _, e := range c.HGetAll(ctx, k.shares()).Val() {
			f := strings.Fields(e)
			g, _ := strconv.ParseFloat(f[4], 64)
			sum += g
		}
		if sum > 100+1e-9 {
			t.Fatalf("after %s's refresh the entries hold %v, over the rate", id, sum)
		}
		return r
	}
	// next returns the next message, with every version replaced by v.
	next := func() string {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		m, err := ps.ReceiveMessage(rctx)
		if err != nil {
			t.Fatalf("no message: %v", err)
		}
		var out []string
		for f := range strings.FieldsSeq(m.Payload) {
			if id, g, ok := strings.Cut(f, "="); ok {
				v, rate, _ := strings.Cut(g, ":")
				if e := strings.Fields(c.HGet(ctx, k.shares(), id).Val()); len(e) != 13 || e[12] != v {
					t.Errorf("message %q: the version is not that of %s's entry %v", f, id, e)
				}
				f = id + "=v:" + rate
			}
			out = append(out, f)
		}
		return strings.Join(out, " ")
	}
	batch := [levels]float64{0, 0, 500}
	if r := ask("a", batch); r.rate != 100 {
		t.Fatalf("a alone got %v", r.rate)
	}
	// b is owed half, which a holds: a is named.
	if r := ask("b", batch); r.rate != 0 || !r.short {
		t.Fatalf("b got %v (short %v), want 0 beside a's whole rate", r.rate, r.short)
	}
	if m := next(); m != "a" {
		t.Errorf("message %q, want a named", m)
	}
	// a gives half up, and it goes to b in the same call.
	if r := ask("a", batch); r.rate != 50 {
		t.Fatalf("a got %v, want 50", r.rate)
	}
	if m := next(); m != "b=v:50" {
		t.Errorf("message %q, want b granted 50", m)
	}
	if r := ask("b", batch); r.rate != 50 || r.short {
		t.Fatalf("b got %v (short %v), want 50", r.rate, r.short)
	}
	// An Interactive process is owed 40 of what a and b hold: both are
	// named, and each refresh that gives some up grants it.
	if r := ask("i", [levels]float64{40, 0, 0}); r.rate != 0 || !r.short {
		t.Fatalf("i got %v, want 0 until the others give up", r.rate)
	}
	if m := next(); m != "a b" && m != "b a" {
		t.Errorf("message %q, want a and b named", m)
	}
	ask("a", batch)
	if m := next(); m != "i=v:20" {
		t.Errorf("message %q, want i granted 20", m)
	}
	ask("b", batch)
	if m := next(); m != "i=v:40" {
		t.Errorf("message %q, want i granted 40", m)
	}
	// i's own refresh now gets what it was sent, at a later version.
	before := strings.Fields(c.HGet(ctx, k.shares(), "i").Val())[12]
	r := ask("i", [levels]float64{40, 0, 0})
	if v, _ := strconv.ParseInt(before, 10, 64); r.rate != 40 || r.seq != v+1 {
		t.Errorf("i's refresh: %v at version %d, want 40 at %d", r.rate, r.seq, v+1)
	}
}

// TestSharesNames: the message parser, and a share sent to a process is
// taken only if newer than what it holds.
func TestSharesNames(t *testing.T) {
	for _, tc := range []struct {
		msg   string
		named bool
		seq   int64
		rate  float64
	}{
		{"x me y", true, 0, 0},
		{"x y", false, 0, 0},
		{"x=3:1.5 me=7:12.25", true, 7, 12.25},
		{"mex=7:1", false, 0, 0},
		{"me=0:5", false, 0, 0},
		{"me=2:-1", false, 0, 0},
		{"me=2:NaN", false, 0, 0},
		{"me=a:1", false, 0, 0},
	} {
		named, seq, rate := names(tc.msg, "me")
		if named != tc.named || seq != tc.seq || rate != tc.rate {
			t.Errorf("names(%q) = %v %d %v, want %v %d %v", tc.msg, named, seq, rate, tc.named, tc.seq, tc.rate)
		}
	}

	b := newBackend(t, newClient(t, "127.0.0.1:1"), WithRefresh(time.Second))
	var got []sluice.Share
	m := &member{grant: func(s sluice.Share) { got = append(got, s) }}
	sk := &shareKey{leased: true, until: time.Now().Add(time.Hour), rate: 20, seq: 5, places: -1, keyRate: 100, keyBurst: 4}
	sk.handed.lanes = []*member{m}
	sk.handed.wants = [][levels]float64{{40, 0, 0}}
	sk.handed.places = [][levels]int{{0, 0, 0}}
	b.push(sk, 4, 35)
	b.applyPushed(sk)
	if len(got) != 0 || sk.rate != 20 {
		t.Errorf("a share sent at version 4 was taken over the one held at 5: %v, rate %v", got, sk.rate)
	}
	b.push(sk, 6, 35)
	b.applyPushed(sk)
	if fmt.Sprint(len(got)) != "1" || got[0].Rate != 35 || sk.seq != 6 {
		t.Errorf("a share sent at version 6 over 5: grants %v, seq %d; want one of 35", got, sk.seq)
	}
}

// TestSharesMoveBetweenRefreshes: with a long refresh (4s), a process that
// joins beside one holding the whole rate gets its half once the holder is
// named and gives it up, a quarter of a refresh after the holder's last
// refresh; without the channel it would wait for the holder's next
// refresh, at its turn (3.6s at the earliest).
func TestSharesMoveBetweenRefreshes(t *testing.T) {
	const refresh = 4 * time.Second
	srv := startRedis(t)
	a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer a.Close()
	la := joinLane(t, a, "api", batch100)
	waitShare(t, la, 100, "alone")
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer b.Close()
	start := time.Now()
	lb := joinLane(t, b, "api", batch100)
	waitShare(t, lb, 50, "beside a")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("b got its half %v after it joined; want within refresh/4 (1s) and a margin", d)
	}
	waitShare(t, la, 50, "a beside b")
}

// A refresher that exits as a Join starts another leaves the nudges to the
// new one: the new subscription stays open and in use when the old one
// stops, and the new refresher stops its own without a panic.
func TestNudgesOfOverlappingRefreshers(t *testing.T) {
	srv := startRedis(t)
	b := newBackend(t, newClient(t, srv.Addr()))
	n := &b.shares.nudges
	old := b.startNudges()
	ps := b.startNudges() // a Join's refresher, before the old one stopped
	b.stopNudges(old)
	n.mu.Lock()
	kept, chans := n.ps == ps, n.chans != nil
	n.mu.Unlock()
	if !kept || !chans {
		t.Fatalf("the old refresher's stop left the new one's nudges: subscription kept %v, channels kept %v", kept, chans)
	}
	sk := &shareKey{key: "k", channel: "sluice-test:moved"}
	b.listen(sk)
	n.mu.Lock()
	listened := n.chans[sk.channel] == sk
	n.mu.Unlock()
	if !listened {
		t.Error("the new refresher did not subscribe to a key's channel")
	}
	b.stopNudges(ps)
	n.mu.Lock()
	cleared := n.ps == nil && n.chans == nil
	n.mu.Unlock()
	if !cleared {
		t.Error("the new refresher's stop left its subscription in place")
	}
}
