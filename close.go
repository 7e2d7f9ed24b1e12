package sluice

import "errors"

// ErrClosed is the error of every request made through a Transport after
// Close, and of every request still waiting in it when Close is called.
var ErrClosed = errors.New("sluice: Transport closed")

// Close stops the Transport: requests waiting in its lanes (or for a
// host's cooldown to end before their sub-limit) fail with ErrClosed, a
// retry waiting out its backoff returns the answer that caused it, later
// requests fail at once, and the lanes' dispatcher
// goroutines exit. Attempts already sent finish as usual, and give their
// slots (and a Backend's leases) back when their bodies are done. Close
// leaves alone what the Transport does not own: the base transport's
// connections (see CloseIdleConnections) and a Backend, which other
// Transports may share (close it after every Transport that uses it).
// Close may be called more than once, and concurrently with requests.
func (t *Transport) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	if t.done != nil {
		close(t.done) // a retry's backoff, a sub-limit's wait for its host
	}
	// A lane created from now on is closed by its creator (see added).
	t.lanes.Range(func(_, v any) bool {
		v.(*lane).close()
		return true
	})
	// No sweep runs after Close: an unused closed Transport is not kept
	// reachable by its timer.
	t.sweepMu.Lock()
	if t.sweeper != nil {
		t.sweeper.Stop()
	}
	t.sweepMu.Unlock()
	return nil
}

// close fails every waiter of the lane with ErrClosed, and every later
// acquire.
func (l *lane) close() {
	l.lock()
	defer l.unlock()
	l.closed = true
	now := l.clk.tick()
	l.revokeLocked(now)
	// Every waiter, those of tenants at their cap included.
	var ws []*waiter
	for p := range l.q.levels {
		l.q.levels[p].each(func(t *tenant) { ws = append(ws, t.waiters...) })
	}
	for _, w := range ws {
		l.q.remove(w)
		l.grantLocked(now, w, ErrClosed)
	}
	l.wakeLocked() // the dispatcher finds the queue empty and exits
}
