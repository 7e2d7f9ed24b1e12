package sluiceredis

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// wakers lets a Take that found every in-flight lease of a key held (see
// WithInFlight) wait until one is given back, instead of asking Redis again
// on a fixed period. take.lua lines the process up among those waiting on
// the key; each lease given back (done.lua, or take.lua giving back
// leases) pops the process that has waited longest and publishes its name
// on a channel named after the key, to which this Backend subscribes on
// one connection while some Take waits on the key. A message naming this
// Backend wakes one of its Takes waiting on the key, which asks Redis
// once: a release costs its own call and one Take, however many processes
// wait. A release nobody is told of (a lease that expired, a message lost
// with its connection, a woken lane that had nothing left to send) is
// found by the next Take after fullWait at most.
//
// One goroutine reads the subscription while any channel is subscribed; it
// drops a channel nobody waited on for subIdle, and exits with the last.
type wakers struct {
	mu      sync.Mutex
	ps      *redis.PubSub // nil while no channel is subscribed
	chans   map[string]*waitChan
	running bool
}

// A waitChan is the Takes waiting on one key's channel.
type waitChan struct {
	ready   chan struct{} // closed once Redis confirmed the subscription
	wake    chan struct{} // a token per waiting Take to wake
	waiting int           // Takes waiting now
	last    time.Time     // the latest Take that waited
}

const (
	// fullWait is the longest a Take waits for a release it is told of
	// before asking Redis again.
	fullWait = 250 * time.Millisecond
	// subIdle is how long a channel stays subscribed after its last wait.
	subIdle = 10 * time.Second
)

// waitFreed waits until a lease of bg's key is given back somewhere in the
// fleet, up to d, the Backend closes, or the subscription is made: the
// first time a key waits, it returns once Redis confirms it (bounded by
// the timeout), so that the caller's next Take, made after, cannot miss a
// release.
func (b *backend) waitFreed(bg *budget, d time.Duration) {
	ch := bg.keys.freed()
	w := &b.wakers
	w.mu.Lock()
	if b.closed.Load() {
		w.mu.Unlock()
		return
	}
	if w.chans == nil {
		w.chans = make(map[string]*waitChan)
	}
	c := w.chans[ch]
	fresh := c == nil
	if fresh {
		c = &waitChan{ready: make(chan struct{}), wake: make(chan struct{}, 4)}
		w.chans[ch] = c
		if w.ps == nil {
			w.ps = b.client.Subscribe(context.Background())
		}
		if !w.running {
			w.running = true
			b.wg.Add(1)
			go b.readFreed(w.ps)
		}
	}
	c.last = time.Now()
	ps := w.ps
	w.mu.Unlock()

	t := time.NewTimer(min(d, fullWait))
	defer t.Stop()
	if fresh {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
		err := ps.Subscribe(ctx, ch)
		cancel()
		if err != nil {
			w.mu.Lock()
			if w.chans[ch] == c {
				delete(w.chans, ch)
			}
			w.mu.Unlock()
			// Not subscribed: the caller asks again after d, as before
			// there was a channel.
			select {
			case <-t.C:
			case <-b.done:
			}
			return
		}
		confirm := time.NewTimer(b.cfg.timeout)
		defer confirm.Stop()
		select {
		case <-c.ready:
		case <-confirm.C:
		case <-b.done:
		}
		return
	}
	w.mu.Lock()
	c.waiting++
	w.mu.Unlock()
	select {
	case <-c.wake:
	case <-t.C:
	case <-b.done:
	}
	w.mu.Lock()
	c.waiting--
	w.mu.Unlock()
}

// readFreed reads ps until every channel is dropped or the Backend closes.
func (b *backend) readFreed(ps *redis.PubSub) {
	defer b.wg.Done()
	w := &b.wakers
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), subIdle/2)
		if b.closed.Load() {
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			w.mu.Lock()
			if c := w.chans[m.Channel]; c != nil && m.Kind == "subscribe" {
				select {
				case <-c.ready:
				default:
					close(c.ready)
				}
			}
			w.mu.Unlock()
		case *redis.Message:
			if m.Payload == b.self {
				w.wakeUp(m.Channel)
			}
		}
		if err != nil && !isTimeout(err) {
			// The connection broke; go-redis reconnects and subscribes
			// again at the next receive. Meanwhile waiters fall back on
			// fullWait.
			select {
			case <-b.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		if w.sweep(ps) {
			return
		}
	}
}

// wakeUp wakes one Take waiting on ch, if any.
func (w *wakers) wakeUp(ch string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.chans[ch]
	if c == nil || c.waiting == 0 {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default: // a wake-up not yet taken: the next waiter takes it
	}
}

// sweep unsubscribes the channels nobody waited on for subIdle, and reports
// whether none is left, in which case it closes ps and the reader must
// exit.
func (w *wakers) sweep(ps *redis.PubSub) bool {
	now := time.Now()
	var drop []string
	w.mu.Lock()
	for ch, c := range w.chans {
		if c.waiting == 0 && now.Sub(c.last) > subIdle {
			drop = append(drop, ch)
			delete(w.chans, ch)
		}
	}
	if len(w.chans) == 0 {
		w.ps, w.running = nil, false
		w.mu.Unlock()
		ps.Close()
		return true
	}
	w.mu.Unlock()
	if len(drop) == 0 {
		return false
	}
	if testHookSwept != nil {
		testHookSwept()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ps.Unsubscribe(ctx, drop...)
	// A Take that came meanwhile subscribed a dropped channel afresh,
	// perhaps before the unsubscribe went out: it is subscribed again,
	// after it, on the same connection.
	var again []string
	w.mu.Lock()
	for _, ch := range drop {
		if w.chans[ch] != nil {
			again = append(again, ch)
		}
	}
	w.mu.Unlock()
	if len(again) > 0 {
		ps.Subscribe(ctx, again...)
	}
	return false
}

// testHookSwept, set only by tests, runs when sweep has dropped channels
// from its map and not yet unsubscribed them.
var testHookSwept func()

// close closes the subscription at Close; the reader then exits.
func (w *wakers) close() {
	w.mu.Lock()
	ps := w.ps
	w.ps, w.chans = nil, nil
	w.mu.Unlock()
	if ps != nil {
		ps.Close()
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
