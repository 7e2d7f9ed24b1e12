package sluice

// slots is a lane's in-flight semaphore: a count of attempts sent and not
// finished, and a limit that can change at any time (the limiter that holds
// it moves it). Lowering the limit below the count cancels nothing: in-flight
// work drains and no new grant is made until the count is under the limit.
//
// slots has no wait list of its own. The lane's single wait queue serves both
// gates: its dispatcher grants a waiter only when a token is due and a slot is
// free, taking both at that instant (token first, then slot). Two queues, one
// per gate, would let a request take its token and then wait for a slot; when
// slots free up, every such request would leave at once, a burst that breaks
// "at most rate x T + burst + 1 in any window T" against strict upstreams. With
// one queue a request waiting for the clock holds no slot, a request waiting
// for a slot holds no token, and the bucket (capped at burst) is what bounds
// the burst after a stall.
//
// slots is not safe for concurrent use; the lane's mutex guards it. The
// zero value has a limit of 0: nothing may be sent.
type slots struct {
	limit int
	inUse int
	// leased, when positive, is one more than the in-flight cap of the
	// lane's share from a Leaser (so that the zero value is no cap, and 1
	// a share of none).
	leased int
}

// free reports whether an attempt may take a slot now.
func (s *slots) free() bool {
	return s.inUse < s.limit && (s.leased == 0 || s.inUse < s.leased-1)
}

func (s *slots) take() { s.inUse++ }

// put returns a slot. It reports whether a slot is now free, so that the
// caller knows to wake the dispatcher.
func (s *slots) put() bool {
	s.inUse--
	return s.free()
}
