package sluice

import (
	"context"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// body releases its attempt's slot when it is read to EOF, fails a read or
// is closed, whichever comes first; when the request's context ends; or,
// as a last resort, when it is collected unclosed (see leakToken).
type body struct {
	rc  io.ReadCloser
	h   *hold
	tok atomic.Pointer[leakToken] // nil once the body is done
}

// hold is an attempt's slot until it is given back. Nothing in it points
// back to the body, so that a context.AfterFunc or a leakToken holding it
// does not keep the body reachable.
type hold struct {
	t   *Transport
	ctx context.Context
	// What giving the slot back needs of the attempt's grant (see
	// grant.Done): the whole grant would take the hold a size class up.
	l      *lane
	start  time.Duration
	tn     *tenant
	timed  bool
	status int
	done   atomic.Bool
	stop   func() bool // stops the context.AfterFunc; nil if none
}

// A leakToken is the last resort: a body holds one until it is done, and
// if the body is collected first, the token's finalizer gives the slot
// back. Tokens are recycled through a pool with their finalizers armed, so
// that the common case, a body closed or read to EOF, pays neither for
// setting a finalizer (or runtime.AddCleanup, which also allocates twice)
// nor for clearing one, which take a runtime-wide lock (figures: README,
// "Cost"). A token the pool drops is collected with no hold, and
// its finalizer does nothing.
type leakToken struct{ h atomic.Pointer[hold] }

var leakTokens = sync.Pool{New: func() any {
	tk := new(leakToken)
	runtime.SetFinalizer(tk, (*leakToken).collected)
	return tk
}}

// wrap returns rc wrapped so that the slot is released once, when the first
// of the ways listed at body happens.
func (t *Transport) wrap(ctx context.Context, rc io.ReadCloser, g grant, status int) *body {
	h := &hold{t: t, ctx: ctx, l: g.l, start: g.start, tn: g.tn, timed: g.timed, status: status}
	b := &body{rc: rc, h: h}
	tk := leakTokens.Get().(*leakToken)
	tk.h.Store(h)
	b.tok.Store(tk)
	if ctx.Done() != nil {
		h.stop = context.AfterFunc(ctx, h.ctxDone)
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

// finish releases the slot, if not yet released, when the body is done,
// and recycles its token.
func (b *body) finish() {
	h := b.h
	if h.release(true) && h.stop != nil {
		h.stop()
	}
	if tk := b.tok.Swap(nil); tk != nil {
		tk.h.Store(nil)
		leakTokens.Put(tk)
	}
}

// collected runs when the token is unreachable: if its body was never done,
// the slot goes back and the lane warns, once, that a body was not closed.
func (tk *leakToken) collected() {
	h := tk.h.Load()
	if h == nil || !h.release(false) {
		return
	}
	if h.stop != nil {
		h.stop()
	}
	if _, warned := h.t.leaked.LoadOrStore(h.l, struct{}{}); !warned {
		h.t.cfg.logger.WarnContext(h.ctx, "sluice: response body not closed; its slot was given back when it was collected (close every response body)",
			"lane", h.l.key)
	}
}

// ctxDone runs when the request's context ends before the body is done:
// the caller has given up on the response, so its slot goes back. Its
// latency is not a sample: it is the caller's, not the server's.
func (h *hold) ctxDone() { h.release(false) }

// release gives the slot back if nobody has, and reports whether it did.
// sample false: the latency is not the server's, and is not measured.
func (h *hold) release(sample bool) bool {
	if !h.done.CompareAndSwap(false, true) {
		return false
	}
	grant{l: h.l, start: h.start, tn: h.tn, timed: h.timed && sample}.Done(h.status)
	return true
}
