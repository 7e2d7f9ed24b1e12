package sluice

import (
	"io"
	"sync/atomic"
)

// body gives its attempt's hold back when it is read to EOF, fails a read
// or is closed, whichever comes first; when the request's context has ended
// and the lane needs the slot or reports its state (see
// lane.reclaimLocked); or, as a last resort, when it is collected unclosed
// (see leakToken). body is the one allocation sluice adds to a request that
// waits for nothing.
type body struct {
	rc   io.ReadCloser
	done atomic.Bool // the hold went back, or is going: see finish
	tok  *leakToken  // nil once the body is done; only finish's winner touches it
}

// A leakToken is the last resort: a body holds its hold's token until it
// is done, and if the body is collected first, the token's finalizer gives
// the slot back. A token points to its hold only while a body has it, and
// the hold to its token only while none does: the collector never frees a
// cycle through an object with a finalizer, and a hold the pool dropped, a
// prepaid hold that keeps its lane, or a hold left to the collector would
// keep each other, and all they point to, for the life of the process.
// Nothing else points to a token in use: a hold points to no body, so
// that the lane's list of holds does not keep a dropped body reachable.
// Tokens are recycled with their holds (see holds), their finalizers
// armed, so that the common case, a body closed or read to EOF, pays
// neither for setting a finalizer (or runtime.AddCleanup, which also
// allocates twice) nor for clearing one, which take a runtime-wide lock. A
// token fills a cache line of its own: a body's writes to it would
// otherwise reach other holds' tokens, in use on other cores. Nothing needs
// an atomic: a finalizer runs after everything that made its object
// unreachable, the race detector's view included.
type leakToken struct {
	h *hold
	_ [56]byte
}

// wrap returns rc wrapped so that h is given back once, when the first of
// the ways listed at body happens. The caller owns h no more.
func wrap(rc io.ReadCloser, h *hold) *body {
	tk := h.tok
	tk.h = h // only while a body has the token: see leakToken
	b := &body{rc: rc, tok: tk}
	h.tok = nil
	atomic.OrUint32(&h.state, holdOut)
	if l := h.l; l.watching() {
		l.watch(h)
	}
	return b
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *body) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

// finish gives the hold back, if the body is not done yet, and recycles
// its token.
func (b *body) finish() {
	if h := b.take(); h != nil {
		h.Done(h.kind)
	}
}

// take marks the body done and returns its hold, for the caller to give
// back (as finish does, or as what a stream's first event said: see
// frameWatch.slot), with its token recycled; nil if it was done already.
func (b *body) take() *hold {
	// Read first: a Close after EOF, as most callers make, finds it done.
	if b.done.Load() || !b.done.CompareAndSwap(false, true) {
		return nil
	}
	tk := b.tok
	b.tok = nil
	h := tk.h
	tk.h = nil
	h.tok = tk // the owner's: the lane's list and watch never touch it
	return h
}

// collected runs when the token is unreachable: if its body was never done,
// the slot goes back and the lane warns, once, that a body was not closed.
// The hold is left to the garbage collector.
func (tk *leakToken) collected() {
	h := tk.h
	if h == nil {
		return // no body had it: collected with its hold
	}
	l := h.l
	if l.release(h, h.kind, false, false) && l.flags.Or(laneLeakWarned)&laneLeakWarned == 0 {
		l.cfg.logger.WarnContext(h.ctx, "sluice: response body not closed; its slot was given back when it was collected (close every response body)",
			"lane", l.name())
	}
}
