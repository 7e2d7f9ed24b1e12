package sluiceredis

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// nudges lets a Backend's process refresh a key's share as soon as
// share.lua names it, instead of at its turn. A share that moves from one
// process to another is given up by the first at its refresh and taken by
// the second at its own, and idles in between; a process owed a share
// waits in the meantime. So share.lua names, on a channel per key, the
// processes that hold more than their part when the caller is owed some,
// and those owed some when rate is left that nobody holds; each named
// process refreshes at once, though no sooner than nudgeGap after its last
// refresh, which bounds what the names cost: a Backend makes at most
// refresh/nudgeGap calls a second per key. A name that is lost (the
// subscription broken, Redis down) costs only the wait for the refresh at
// its turn.
//
// The subscription is one connection per Backend, made by the refresher
// goroutine when it starts and closed when it exits; one goroutine reads
// it meanwhile.
type nudges struct {
	mu    sync.Mutex
	ps    *redis.PubSub
	chans map[string]*shareKey // by channel
}

// nudgeGap is the least time, as a fraction of the refresh interval,
// between two refreshes of a key that a name brings forward.
const nudgeGap = 4 // refresh / 4

// startNudges subscribes for names, starts the goroutine that reads them,
// and returns the subscription; stopNudges undoes it. Both are called by
// the refresher goroutine.
func (b *backend) startNudges() *redis.PubSub {
	n := &b.shares.nudges
	n.mu.Lock()
	defer n.mu.Unlock()
	ps := b.client.Subscribe(context.Background())
	n.ps, n.chans = ps, make(map[string]*shareKey)
	b.wg.Add(1)
	go b.readNudges(ps)
	return ps
}

// stopNudges closes ps, the subscription of an exiting refresher. A Join
// that comes once the refresher found no key left starts another, which
// may subscribe before this one stops: the nudges are then the new
// refresher's, and are left to it.
func (b *backend) stopNudges(ps *redis.PubSub) {
	n := &b.shares.nudges
	n.mu.Lock()
	if n.ps == ps {
		n.ps, n.chans = nil, nil
	}
	n.mu.Unlock()
	ps.Close()
}

// listen subscribes to sk's channel if it is not yet; on failure the next
// refresh tries again. Called by the refresher goroutine.
func (b *backend) listen(sk *shareKey) {
	n := &b.shares.nudges
	n.mu.Lock()
	ps := n.ps
	if ps == nil || n.chans[sk.channel] == sk {
		n.mu.Unlock()
		return
	}
	n.chans[sk.channel] = sk
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
	err := ps.Subscribe(ctx, sk.channel)
	cancel()
	if err != nil {
		n.mu.Lock()
		if n.chans != nil && n.chans[sk.channel] == sk {
			delete(n.chans, sk.channel)
		}
		n.mu.Unlock()
	}
}

// unlisten unsubscribes from the channel of a key that has no lanes left.
func (b *backend) unlisten(sk *shareKey) {
	n := &b.shares.nudges
	n.mu.Lock()
	ps := n.ps
	if ps == nil || n.chans[sk.channel] != sk {
		n.mu.Unlock()
		return
	}
	delete(n.chans, sk.channel)
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
	ps.Unsubscribe(ctx, sk.channel)
	cancel()
}

// readNudges reads ps until it is closed, and brings forward the refresh
// of each key a message names this Backend for.
func (b *backend) readNudges(ps *redis.PubSub) {
	defer b.wg.Done()
	n := &b.shares.nudges
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), time.Second)
		n.mu.Lock()
		stopped := n.ps != ps
		n.mu.Unlock()
		if stopped {
			return
		}
		if err != nil {
			if !isTimeout(err) {
				// The connection broke: go-redis reconnects and subscribes
				// again at the next receive; meanwhile, keys refresh at
				// their turn.
				select {
				case <-b.done:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
			continue
		}
		m, ok := msg.(*redis.Message)
		if !ok {
			continue
		}
		named, seq, rate := names(m.Payload, b.self)
		if !named {
			continue
		}
		n.mu.Lock()
		sk := n.chans[m.Channel]
		n.mu.Unlock()
		switch {
		case sk == nil:
		case seq > 0:
			b.push(sk, seq, rate)
		default:
			b.nudge(sk)
		}
	}
}

// names reads share.lua's message, a space-separated list of process ids
// to refresh, and of id=seq:rate for a share granted to id: whether it
// names id, and the share granted if so (seq 0: none).
func names(msg, id string) (named bool, seq int64, rate float64) {
	for f := range strings.FieldsSeq(msg) {
		name, grant, _ := strings.Cut(f, "=")
		if name != id {
			continue
		}
		if grant == "" {
			return true, 0, 0
		}
		v, r, _ := strings.Cut(grant, ":")
		s, err1 := strconv.ParseInt(v, 10, 64)
		x, err2 := strconv.ParseFloat(r, 64)
		if err1 != nil || err2 != nil || s <= 0 || !(x >= 0) || math.IsInf(x, 0) {
			return false, 0, 0
		}
		return true, s, x
	}
	return false, 0, 0
}

// push records a larger share granted to sk by another process's refresh,
// for the refresher goroutine to apply at once (see applyPushed).
func (b *backend) push(sk *shareKey, seq int64, rate float64) {
	s := &b.shares
	s.mu.Lock()
	if seq > sk.pushed.seq {
		sk.pushed.seq, sk.pushed.rate = seq, rate
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// nudge brings sk's next refresh forward to now, or to nudgeGap after its
// last one.
func (b *backend) nudge(sk *shareKey) {
	s := &b.shares
	s.mu.Lock()
	at := time.Now()
	if gap := sk.sent.Add(b.cfg.refresh / nudgeGap); gap.After(at) {
		at = gap
	}
	if sk.nudged.IsZero() || at.Before(sk.nudged) {
		sk.nudged = at
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
