package sluiceredis

import (
	"context"
	"time"

	"github.com/sluice-go/sluice"
)

const (
	// parkAfter: a key whose lanes were idle (nothing waiting, nothing in
	// flight, nothing granted since the last refresh) at this many
	// refreshes in a row is parked: its process gives its share back to
	// the fleet, and its lanes are left a share of nothing (they keep the
	// one token a share of no rate holds: a request to a parked key is
	// sent at once, and the next waits for the key's refresh). A parked
	// key costs no Redis call.
	parkAfter = 3
	// parkPolls: a parked key's lanes are looked at (locally) this many
	// times a refresh, all parked keys of a process together; a key with
	// a request waiting is refreshed at once, so that a request to an idle
	// key waits at most a refresh divided by parkPolls, and a round trip.
	parkPolls = 10
)

// idle reports whether lanes, whose demand was read into now, want nothing
// and were granted nothing since the last refresh (at prev). A lane with
// budgets is never idle: it holds what it was granted of them.
func idle(lanes []*member) bool {
	for _, m := range lanes {
		d := m.now
		if len(d.Budgets) > 0 {
			return false
		}
		for l := range levels {
			if d.Waiting[l] > 0 || d.InFlight[l] > 0 || d.Granted[l] != m.prev.Granted[l] {
				return false
			}
		}
	}
	return true
}

// park gives sk's share back to the fleet and hands its lanes a share of
// nothing until a request comes (see parkAfter); it reports whether Redis
// took the share back (if not, the key stays as it was), within ctx.
// Called by the refresher goroutine, while no other refresh of sk runs.
func (b *backend) park(ctx context.Context, sk *shareKey, lanes []*member, now time.Time) bool {
	err := b.client.HDel(ctx, sk.redis[0], b.self).Err()
	if err != nil {
		return false
	}
	sk.parked, sk.idle, sk.interactive = true, 0, false
	sk.leased, sk.until, sk.rate, sk.seq = false, now, 0, 0
	sk.handed.lanes = nil // a share pushed meanwhile is not applied
	for _, m := range lanes {
		m.grant(sluice.Share{Rate: 0, Burst: 1, InFlight: -1})
	}
	sk.next = nextPoll(now, b.cfg.refresh)
	return true
}

// nextPoll is when parked keys are looked at next after now: every parked
// key of a process at once (see parkPolls).
func nextPoll(now time.Time, refresh time.Duration) time.Time {
	every := max(refresh/parkPolls, time.Millisecond)
	return now.Truncate(every).Add(every)
}

// wakes returns the parked keys among polls whose lanes want something
// now or were granted some since it was parked, having set the others'
// next poll. Called by the refresher goroutine
// without shares.mu.
func (b *backend) wakes(polls []*shareKey, now time.Time) []*shareKey {
	var due []*shareKey
	for _, sk := range polls {
		lanes := b.live(sk)
		woke := len(lanes) == 0 // gone: refresh says so to Redis
		for _, m := range lanes {
			for l := range levels {
				woke = woke || m.now.Waiting[l] > 0 || m.now.InFlight[l] > 0 || m.now.Granted[l] != m.prev.Granted[l]
			}
		}
		if !woke {
			sk.next = nextPoll(now, b.cfg.refresh)
			continue
		}
		due = append(due, sk)
	}
	return due
}
