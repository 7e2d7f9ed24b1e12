package sluice

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// ForEachLookahead is how many item goroutines ForEach keeps beyond the
// Transport's in-flight limit.
//
// The limit counts attempts in flight, but an item's goroutine also spends
// time outside RoundTrip: building its request before, reading and decoding
// the response after, and being started at all. A few extra goroutines,
// already queued in the Transport when a token comes due or a slot frees,
// keep the Transport busy across those gaps, so that ForEach never leaves a
// grant unused while it starts the next item. Four covers them for a
// handful of items at once; more would only wait in the Transport's queue,
// which holds them at no benefit.
const ForEachLookahead = 4

// forEachPoll is how often a ForEach that is at its bound re-reads the
// Transport's in-flight limit when no item finishes meanwhile. A finishing
// item re-reads it at once; the poll only catches a limit raised while every
// item is still running.
const forEachPoll = 50 * time.Millisecond

// ForEach calls fn for every item of items, concurrently, with the semantics
// of an errgroup.Group from golang.org/x/sync, and returns when every call
// has returned. The number of goroutines follows what t can send at once.
//
// Bound. ForEach starts a goroutine for an item only while fewer item
// goroutines are running than t's current in-flight limit (the sum of its
// lanes' limits, each capped by its share of a fleet's in-flight cap under
// a Leaser; before t has any lane, the minimum of WithConcurrency) plus
// ForEachLookahead. The limit is re-read before every start (over more
// than 64 lanes, a sum at most a few milliseconds old), so as the
// concurrency controller raises or lowers it, ForEach follows: a lower limit
// stops new starts until enough items finish (nothing running is
// cancelled). The bound assumes fn sends about one request at a time through
// t; fn that does not use t is still bounded, just not usefully.
//
// Laziness. ForEach takes the next item from items only when it can start
// it at once, in the calling goroutine, so a large or endless sequence (a
// database cursor, lines of a file) is read no faster than it is processed,
// and memory stays flat however many items there are.
//
// Errors and cancellation. The context passed to fn is derived from ctx and
// is cancelled when the first call of fn returns a non-nil error (the error
// is its cause, see context.Cause) or panics. Once that context is done,
// ForEach takes no more items, waits for the calls already started, and
// returns: the first non-nil error returned by fn if there is one, otherwise
// ctx.Err() if ctx ended before every item was taken (items is then asked
// for one more, which is not run, to tell), otherwise nil. An items that
// itself ends once ctx ends (rows of a QueryContext(ctx), a channel its
// producer closes on ctx.Done) answers that none is left, and ForEach then
// returns nil though some were never taken: give such a source a context
// of its own, or check ctx.Err() after ForEach. No
// goroutine started by ForEach outlives it, whatever happens.
//
// Panics. A panic in fn is not swallowed: it cancels the rest as an error
// would, and once every started call has returned, ForEach panics in the
// caller's goroutine with a *PanicError carrying the value and the stack of
// the goroutine that panicked (so that a crash report still shows where).
// If fn calls runtime.Goexit (as t.FailNow does in a test), ForEach calls
// runtime.Goexit too after waiting. A panic raised by items itself
// propagates at once after the started calls have returned.
//
// ForEach differs from an errgroup loop with SetLimit(n) in that the bound
// follows t's limit instead of a guess fixed in advance (see docs/design.md,
// "Fan-out").
func ForEach[T any](ctx context.Context, t *Transport, items iter.Seq[T], fn func(ctx context.Context, item T) error) error {
	if t == nil {
		panic("sluice: ForEach with a nil *Transport")
	}
	if fn == nil {
		panic("sluice: ForEach with a nil fn")
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	f := &fanout{t: t, cancel: cancel, wake: make(chan struct{}, 1)}
	waited := false
	defer func() {
		// Reached with waited false only when items panicked: no goroutine
		// may outlive ForEach, so stop the rest and wait before the panic
		// goes on.
		if !waited {
			cancel(nil)
			f.wg.Wait()
		}
		f.stopTimer()
	}()

	// Wait for room before taking each item, not after: the iterator is
	// asked for an item only when it can start at once. If the caller's
	// ctx ends meanwhile, and no call failed, it is asked once more, to
	// tell whether every item was taken.
	complete := true // every item was taken
	if items != nil {
		next, stop := iter.Pull(items)
		defer stop()
		for {
			if !f.await(ctx) {
				complete = false
				if parent.Err() != nil && !f.failed() {
					_, more := next()
					complete = !more
				}
				break
			}
			item, ok := next()
			if !ok {
				break
			}
			f.live.Add(1)
			f.wg.Add(1)
			go f.run(func() error { return fn(ctx, item) })
		}
	}
	f.wg.Wait()
	waited = true

	switch {
	case f.panicked != nil:
		panic(f.panicked)
	case f.goexit:
		runtime.Goexit()
	case f.err != nil:
		return f.err
	case !complete && parent.Err() != nil:
		return parent.Err()
	}
	return nil
}

// fanout is the state of one ForEach call.
type fanout struct {
	t      *Transport
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	live   atomic.Int64  // item goroutines started and not finished
	wake   chan struct{} // capacity 1: an item finished
	timer  *time.Timer   // the poll; nil until first needed

	mu       sync.Mutex
	err      error       // the first error returned by fn
	panicked *PanicError // the first panic in fn
	goexit   bool        // fn called runtime.Goexit
}

// failed reports whether a call of fn returned an error, panicked or
// called runtime.Goexit.
func (f *fanout) failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err != nil || f.panicked != nil || f.goexit
}

// await blocks until one more item goroutine may start, and reports true;
// or, once ctx is done, reports false.
func (f *fanout) await(ctx context.Context) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		if f.live.Load() < int64(f.t.fanoutLimit())+ForEachLookahead {
			return true
		}
		if f.timer == nil {
			f.timer = time.NewTimer(forEachPoll)
		} else {
			f.timer.Reset(forEachPoll)
		}
		select {
		case <-f.wake:
		case <-f.timer.C:
		case <-ctx.Done():
			return false
		}
	}
}

func (f *fanout) stopTimer() {
	if f.timer != nil {
		f.timer.Stop()
	}
}

// run calls call, records how it ended, and signals that a goroutine is free.
func (f *fanout) run(call func() error) {
	returned := false
	defer func() {
		if !returned {
			// recover returns nil only for runtime.Goexit: since Go 1.21
			// panic(nil) panics with a *runtime.PanicNilError.
			if v := recover(); v != nil {
				f.fail(nil, &PanicError{Value: v, Stack: debug.Stack()}, false)
			} else {
				f.fail(nil, nil, true)
			}
		}
		f.live.Add(-1)
		select {
		case f.wake <- struct{}{}:
		default:
		}
		f.wg.Done()
	}()
	err := call()
	returned = true
	if err != nil {
		f.fail(err, nil, false)
	}
}

// fail records the first error, the first panic, and any Goexit, and
// cancels the context passed to the items still running.
func (f *fanout) fail(err error, p *PanicError, goexit bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case p != nil && f.panicked == nil:
		f.panicked = p
		f.cancel(p)
	case goexit:
		f.goexit = true
		f.cancel(errGoexit)
	case err != nil && f.err == nil:
		f.err = err
		f.cancel(err)
	}
}

var errGoexit = errors.New("sluice: ForEach: fn called runtime.Goexit")

// PanicError is the value ForEach panics with when fn panicked: the value
// fn panicked with and the stack of the goroutine at that moment.
type PanicError struct {
	Value any
	Stack []byte // as returned by runtime/debug.Stack
}

// Error returns the panic value and the stack of the goroutine that
// panicked, so that a program that crashes with it still shows where.
func (p *PanicError) Error() string {
	return fmt.Sprintf("sluice: ForEach: panic in fn: %v\n\ngoroutine stack at the panic:\n%s", p.Value, p.Stack)
}

// Unwrap returns the panic value if it is an error, so that errors.Is and
// errors.As see through a recovered *PanicError.
func (p *PanicError) Unwrap() error {
	if err, ok := p.Value.(error); ok {
		return err
	}
	return nil
}
