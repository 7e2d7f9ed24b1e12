package sluice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"net/http"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sync/errgroup"
)

// count yields 0, 1, ..., n-1 and counts how many it has yielded: an
// iterator that holds no items in memory and shows how far it was read.
type count struct {
	n      int
	pulled atomic.Int64
}

func (c *count) seq() iter.Seq[int] {
	return func(yield func(int) bool) {
		for i := range c.n {
			c.pulled.Add(1)
			if !yield(i) {
				return
			}
		}
	}
}

// gauge tracks a current and a peak value.
type gauge struct{ cur, peak atomic.Int64 }

func (g *gauge) inc() {
	n := g.cur.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (g *gauge) dec() { g.cur.Add(-1) }

// gateBase is a base RoundTripper whose requests block until the test lets
// them through, one per receive on release, or until their context ends.
type gateBase struct {
	release chan struct{}
	in      gauge
}

func newGateBase() *gateBase { return &gateBase{release: make(chan struct{})} }

func (g *gateBase) RoundTrip(req *http.Request) (*http.Response, error) {
	g.in.inc()
	defer g.in.dec()
	select {
	case <-g.release:
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
}

func TestForEachCallsFnForEveryItem(t *testing.T) {
	tr := mustNew(t, bodyBase{}, WithConcurrency(8, 8))
	const n = 10_000
	seen := make([]atomic.Int32, n)
	c := &count{n: n}
	err := ForEach(t.Context(), tr, c.seq(), func(ctx context.Context, i int) error {
		seen[i].Add(1)
		return get(ctx, tr, "")
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range seen {
		if v := seen[i].Load(); v != 1 {
			t.Fatalf("item %d: fn called %d times", i, v)
		}
	}
	s, _ := tr.Stats().Lane("api.test")
	if g := s.Levels[Normal].Granted; g != n {
		t.Errorf("Transport granted %d attempts, want %d", g, n)
	}
}

func TestForEachEmptyAndNil(t *testing.T) {
	tr := mustNew(t, nil)
	called := false
	fn := func(context.Context, int) error { called = true; return nil }
	if err := ForEach(t.Context(), tr, (&count{}).seq(), fn); err != nil {
		t.Errorf("empty sequence: %v", err)
	}
	if err := ForEach(t.Context(), tr, nil, fn); err != nil {
		t.Errorf("nil sequence: %v", err)
	}
	if called {
		t.Error("fn called for no item")
	}
}

// TestForEachBoundFollowsLimit checks the goroutine bound exactly, in a
// bubble, as the limit goes up and down, and that items are read lazily.
func TestForEachBoundFollowsLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := newGateBase()
		tr := mustNew(t, base, WithConcurrency(1, 64))
		l := tr.lane("api.test")
		pinLimit(l, 8)

		ctx, cancel := context.WithCancel(t.Context())
		c := &count{n: 1_000_000}
		var live gauge
		var finished atomic.Int64
		done := make(chan error, 1)
		go func() {
			done <- ForEach(ctx, tr, c.seq(), func(ctx context.Context, i int) error {
				live.inc()
				defer live.dec()
				defer finished.Add(1)
				return get(ctx, tr, "")
			})
		}()

		check := func(step string, wantLive, wantIn int) {
			t.Helper()
			synctest.Wait()
			if got := live.cur.Load(); got != int64(wantLive) {
				t.Errorf("%s: %d items running, want %d", step, got, wantLive)
			}
			if got := base.in.cur.Load(); got != int64(wantIn) {
				t.Errorf("%s: %d requests at the base, want %d", step, got, wantIn)
			}
			// Lazy: the iterator was read exactly as far as items started.
			if got, want := c.pulled.Load(), live.cur.Load()+finished.Load(); got != want {
				t.Errorf("%s: %d items read from the iterator, %d started", step, got, want)
			}
		}

		// 8 in flight, ForEachLookahead more queued in the Transport.
		check("limit 8", 8+ForEachLookahead, 8)

		// A raised limit is seen within one poll even if nothing finishes.
		pinLimit(l, 20)
		time.Sleep(forEachPoll)
		check("limit 20", 20+ForEachLookahead, 20)

		// A lowered limit cancels nothing, and stops new starts until the
		// running items drop below the new bound.
		pinLimit(l, 4)
		for range 10 {
			base.release <- struct{}{}
		}
		check("limit 4, 10 finished", 14, 10)
		for range 10 {
			base.release <- struct{}{}
		}
		check("limit 4, 20 finished", 4+ForEachLookahead, 4)

		if got := live.peak.Load(); got != 20+ForEachLookahead {
			t.Errorf("peak %d items running, want %d", got, 20+ForEachLookahead)
		}

		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("ForEach after cancel = %v, want context.Canceled", err)
		}
		if n := live.cur.Load(); n != 0 {
			t.Errorf("%d items still running after ForEach returned", n)
		}
	})
}

func TestForEachFirstErrorCancelsTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, bodyBase{}, WithConcurrency(8, 8))
		boom := errors.New("boom")
		c := &count{n: 1_000_000}
		var causes sync.Map
		err := ForEach(t.Context(), tr, c.seq(), func(ctx context.Context, i int) error {
			if i == 5 {
				time.Sleep(time.Millisecond) // let the others start and block
				return boom
			}
			<-ctx.Done()
			causes.Store(i, context.Cause(ctx))
			return fmt.Errorf("item %d: %w", i, ctx.Err())
		})
		if err != boom {
			t.Fatalf("ForEach = %v, want the first error, boom", err)
		}
		n := 0
		causes.Range(func(k, v any) bool {
			n++
			if v != boom {
				t.Errorf("item %v saw cause %v, want boom", k, v)
			}
			return true
		})
		if n != 8+ForEachLookahead-1 {
			t.Errorf("%d other items were running, want %d", n, 8+ForEachLookahead-1)
		}
		if p := c.pulled.Load(); p != 8+ForEachLookahead {
			t.Errorf("%d items read from the iterator after the error, want %d", p, 8+ForEachLookahead)
		}
	})
}

func TestForEachContextCancelStopsReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, bodyBase{}, WithConcurrency(2, 2), WithRate(10, time.Second))
		ctx, cancel := context.WithCancel(t.Context())
		c := &count{n: 1_000_000}
		var finished atomic.Int64
		go func() {
			time.Sleep(time.Second + time.Millisecond)
			cancel()
		}()
		err := ForEach(ctx, tr, c.seq(), func(ctx context.Context, i int) error {
			if err := get(ctx, tr, ""); err != nil {
				return nil // the cancelled ones: ForEach must report ctx's error itself
			}
			finished.Add(1)
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ForEach = %v, want context.Canceled", err)
		}
		// 10/s with a burst of 1 for 1 s: 11 requests.
		if f := finished.Load(); f != 11 {
			t.Errorf("%d requests finished, want 11", f)
		}
		// One more is read, not started, to tell whether it was the last.
		if p := c.pulled.Load(); p > 11+2+ForEachLookahead+1 {
			t.Errorf("%d items read, want no more than started and one", p)
		}
		if err := ForEach(ctx, tr, c.seq(), func(context.Context, int) error {
			t.Error("fn called with a done context")
			return nil
		}); !errors.Is(err, context.Canceled) {
			t.Errorf("ForEach with a done context = %v, want context.Canceled", err)
		}
	})
}

func TestForEachPanicReachesTheCaller(t *testing.T) {
	tr := mustNew(t, bodyBase{}, WithConcurrency(4, 4))
	c := &count{n: 1_000}
	var live gauge
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		ForEach(t.Context(), tr, c.seq(), func(ctx context.Context, i int) error {
			live.inc()
			defer live.dec()
			if i == 42 {
				panicInItem()
			}
			return get(ctx, tr, "")
		})
		t.Error("ForEach returned after a panic")
	}()
	pe, ok := recovered.(*PanicError)
	if !ok {
		t.Fatalf("recovered %T %v, want *PanicError", recovered, recovered)
	}
	if pe.Value != "item 42 is bad" {
		t.Errorf("Value = %v", pe.Value)
	}
	// The stack is the panicking goroutine's, not the caller's.
	if s := string(pe.Stack); !strings.Contains(s, "panicInItem") {
		t.Errorf("Stack does not show the panic site:\n%s", s)
	}
	if !strings.Contains(pe.Error(), "item 42 is bad") || !strings.Contains(pe.Error(), "panicInItem") {
		t.Errorf("Error() = %q, want the value and the stack", pe.Error())
	}
	if n := live.cur.Load(); n != 0 {
		t.Errorf("%d items still running when the panic reached the caller", n)
	}
	if p := c.pulled.Load(); p == int64(c.n) {
		t.Error("ForEach read every item after the panic")
	}

	// An error value stays reachable through errors.Is.
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("recovered %v, want one that wraps io.ErrUnexpectedEOF", err)
			}
		}()
		ForEach(t.Context(), tr, (&count{n: 3}).seq(), func(context.Context, int) error {
			panic(io.ErrUnexpectedEOF)
		})
	}()
}

//go:noinline
func panicInItem() { panic("item 42 is bad") }

func TestForEachGoexit(t *testing.T) {
	tr := mustNew(t, bodyBase{})
	returned := make(chan bool, 1)
	go func() {
		ok := false
		defer func() { returned <- ok }()
		ForEach(context.Background(), tr, (&count{n: 100}).seq(), func(_ context.Context, i int) error {
			if i == 3 {
				runtime.Goexit()
			}
			return nil
		})
		ok = true
	}()
	if <-returned {
		t.Error("ForEach returned normally after fn called runtime.Goexit")
	}
}

func TestForEachIteratorPanicWaitsForItems(t *testing.T) {
	tr := mustNew(t, bodyBase{}, WithConcurrency(4, 4))
	var live gauge
	items := func(yield func(int) bool) {
		for i := range 10 {
			if !yield(i) {
				return
			}
		}
		panic("cursor broke")
	}
	defer func() {
		if r := recover(); r != "cursor broke" {
			t.Errorf("recovered %v, want the iterator's panic", r)
		}
		if n := live.cur.Load(); n != 0 {
			t.Errorf("%d items still running when the iterator's panic reached the caller", n)
		}
	}()
	ForEach(t.Context(), tr, items, func(ctx context.Context, i int) error {
		live.inc()
		defer live.dec()
		time.Sleep(10 * time.Millisecond)
		return nil
	})
}

// forEachItems is the 1,000,000 of the issue; under the race detector, whose
// bookkeeping is ten times slower and heavier, a tenth.
var forEachItems = func() int {
	if raceEnabled {
		return 100_000
	}
	return 1_000_000
}()

// peakSampler samples the heap and the goroutine count every
// millisecond, without stopping the world (runtime/metrics, not
// ReadMemStats), until stopped.
type peakSampler struct {
	peak  peaks
	base  [numPeakSamples]uint64 // at the first sample, just after a GC
	ready chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

// peaks is what a peakSampler saw, each over its value at the start.
type peaks struct {
	// heap: the heap's objects, garbage not yet swept included. live: the
	// heap the last GC found live, which garbage does not inflate, nor
	// the heap earlier tests left live (whose garbage the heap holds).
	heap, live uint64
	goroutines int
	gcs        uint64 // GC cycles ended: live is measured only if some did
}

// The runtime/metrics a peakSampler reads, in its samples' order.
const (
	sampleHeap = iota
	sampleLive
	sampleGoroutines
	sampleGCs
	numPeakSamples
)

func startPeakSampler() *peakSampler {
	runtime.GC()
	s := &peakSampler{ready: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	samples := make([]metrics.Sample, numPeakSamples)
	samples[sampleHeap].Name = "/memory/classes/heap/objects:bytes"
	samples[sampleLive].Name = "/gc/heap/live:bytes"
	samples[sampleGoroutines].Name = "/sched/goroutines:goroutines"
	samples[sampleGCs].Name = "/gc/cycles/total:gc-cycles"
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		// The runtime's goroutine count includes its own (GC workers and
		// the like, started by the GC above): a baseline taken here makes
		// the peak count only goroutines started after it.
		metrics.Read(samples)
		var peak [numPeakSamples]uint64
		for i := range samples {
			s.base[i] = samples[i].Value.Uint64()
			peak[i] = s.base[i]
		}
		close(s.ready)
		for {
			metrics.Read(samples)
			for i := range samples {
				peak[i] = max(peak[i], samples[i].Value.Uint64())
			}
			select {
			case <-s.stop:
				over := func(i int) uint64 { return peak[i] - s.base[i] }
				s.peak = peaks{heap: over(sampleHeap), live: over(sampleLive),
					goroutines: int(over(sampleGoroutines)), gcs: over(sampleGCs)}
				return
			case <-tick.C:
			}
		}
	}()
	<-s.ready
	return s
}

// finish stops the sampler and returns its peaks.
func (s *peakSampler) finish() peaks {
	close(s.stop)
	<-s.done
	return s.peak
}

// TestForEachMillionItems fans out 1,000,000 items through a Transport with
// a fixed limit of 8 and an in-memory base, and checks that at most
// 8 + ForEachLookahead items run at once and the live heap grows by less
// than 16 MB (a goroutine a item keeps hundreds of MB live).
func TestForEachMillionItems(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const limit = 8
	tr := mustNew(t, bodyBase{}, WithConcurrency(limit, limit))
	c := &count{n: forEachItems}
	var live gauge
	s := startPeakSampler()
	start := time.Now()
	err := ForEach(t.Context(), tr, c.seq(), func(ctx context.Context, i int) error {
		live.inc()
		defer live.dec()
		return get(ctx, tr, "")
	})
	elapsed := time.Since(start)
	pk := s.finish()
	if err != nil {
		t.Fatal(err)
	}
	if p := c.pulled.Load(); p != int64(c.n) {
		t.Fatalf("%d of %d items read", p, c.n)
	}
	t.Logf("%d items: %v (%.0f ns/item), peak %d items running (bound %d), peak %d goroutines started; heap grew by %.1f MB, %.1f MB live, over %d GCs (sampled)",
		c.n, elapsed.Round(time.Millisecond), float64(elapsed.Nanoseconds())/float64(c.n),
		live.peak.Load(), limit+ForEachLookahead, pk.goroutines, float64(pk.heap)/1e6, float64(pk.live)/1e6, pk.gcs)
	if p := live.peak.Load(); p > limit+ForEachLookahead {
		t.Errorf("peak %d items running, want <= %d", p, limit+ForEachLookahead)
	}
	// The runtime's count also holds the lane's dispatcher, the sampler, and
	// goroutines that have finished their item but not yet exited, which on
	// a loaded machine can be several for a moment; a naive fan-out would
	// show hundreds of thousands here.
	// The exact bound is the peak of running items above. The sampled
	// goroutine count also sees goroutines the runtime and earlier tests
	// leave winding down on a loaded machine, so it is only checked against
	// what a naive loop would start (every item at once).
	if pk.goroutines > 10*(limit+ForEachLookahead) {
		t.Errorf("peak %d goroutines over the baseline, want about %d", pk.goroutines, limit+ForEachLookahead)
	}
	// The live heap, not the heap: the garbage the heap holds grows with
	// what earlier tests left live, as the GC lets the heap grow to twice
	// the live heap (GOGC=100).
	if pk.gcs == 0 {
		t.Fatal("no GC ended during the fan-out: the live heap was not measured")
	}
	if pk.live >= 16<<20 {
		t.Errorf("live heap grew by %d bytes, want < 16 MB", pk.live)
	}
}

// BenchmarkForEach fans out 1,000,000 items per op through a Transport with
// a fixed limit of 8 and an in-memory base, and reports ns per item and the
// peaks. The naive variant (errgroup, one goroutine per item) runs 100,000
// items for contrast; run with -benchtime=1x.
func BenchmarkForEach(b *testing.B) {
	run := func(b *testing.B, n int, fanout func(ctx context.Context, tr *Transport, items iter.Seq[int], fn func(context.Context, int) error) error) {
		const limit = 8
		var pk peaks
		var elapsed time.Duration
		for b.Loop() {
			tr := mustNew(b, bodyBase{}, WithConcurrency(limit, limit))
			s := startPeakSampler()
			start := time.Now()
			err := fanout(b.Context(), tr, (&count{n: n}).seq(), func(ctx context.Context, i int) error {
				return get(ctx, tr, "")
			})
			elapsed += time.Since(start)
			p := s.finish()
			pk = peaks{heap: max(pk.heap, p.heap), live: max(pk.live, p.live), goroutines: max(pk.goroutines, p.goroutines)}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N)/float64(n), "ns/item")
		b.ReportMetric(float64(pk.goroutines), "peak-goroutines")
		b.ReportMetric(float64(pk.heap)/1e6, "peak-heap-MB")
		b.ReportMetric(float64(pk.live)/1e6, "peak-live-MB")
	}
	b.Run("ForEach/items=1000000", func(b *testing.B) { run(b, 1_000_000, ForEach[int]) })
	b.Run("naive-errgroup/items=100000", func(b *testing.B) {
		run(b, 100_000, func(ctx context.Context, _ *Transport, items iter.Seq[int], fn func(context.Context, int) error) error {
			g, ctx := errgroup.WithContext(ctx)
			for item := range items {
				g.Go(func() error { return fn(ctx, item) })
			}
			return g.Wait()
		})
	})
}

// TestForEachAllTakenAsCtxEnds: ctx ends while ForEach waits for room
// after starting the last item; every item was taken and every call
// succeeds, so ForEach returns nil, as an errgroup would.
func TestForEachAllTakenAsCtxEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{})
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		var ran atomic.Int64
		// As many items as the bound: the minimum limit and the lookahead.
		items := slices.Values(make([]int, DefaultMinConcurrency+ForEachLookahead))
		err := ForEach(ctx, tr, items, func(ctx context.Context, _ int) error {
			time.Sleep(time.Second) // ends after ctx, and ignores it
			ran.Add(1)
			return nil
		})
		if err != nil || ran.Load() != DefaultMinConcurrency+ForEachLookahead {
			t.Errorf("ran %d of %d, ForEach returned %v; want all and nil", ran.Load(), DefaultMinConcurrency+ForEachLookahead, err)
		}
		// An item left when ctx ends is not run, and ctx's error is returned.
		ran.Store(0)
		ctx, cancel = context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		items = slices.Values(make([]int, DefaultMinConcurrency+ForEachLookahead+1))
		err = ForEach(ctx, tr, items, func(ctx context.Context, _ int) error {
			time.Sleep(time.Second)
			ran.Add(1)
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) || ran.Load() != DefaultMinConcurrency+ForEachLookahead {
			t.Errorf("ran %d, ForEach returned %v; want %d and the deadline's error", ran.Load(), err, DefaultMinConcurrency+ForEachLookahead)
		}
	})
}

// TestForEachUnboundedConcurrency: WithConcurrency(1, math.MaxInt) starts
// each paced lane at that limit; the sum over two lanes, which ForEach
// bounds its goroutines by, does not overflow.
func TestForEachUnboundedConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			<-release
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		})
		tr := mustNew(t, base, WithRate(100, time.Second), WithConcurrency(1, math.MaxInt))
		var wg sync.WaitGroup
		for _, host := range []string{"a.test", "b.test"} {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			})
		}
		synctest.Wait() // both in flight: no sample has sized either lane
		if n := tr.fanoutLimit(); n < 2 {
			t.Errorf("ForEach's limit over two lanes at math.MaxInt: %d", n)
		}
		close(release)
		wg.Wait()
	})
}

// TestForEachOverManyLanes: a ForEach over a Transport of 5,000 lanes (a
// key per item) sums the lanes' limits at most once per fanoutEvery, not
// at every item: visiting each lane at each of n items made a backfill
// over n keys cost n² lane locks.
func TestForEachOverManyLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 5_000
		tr := mustNew(t, &fakeBase{latency: time.Millisecond},
			WithKey(func(r *http.Request) string { return r.URL.Path }))
		call := func(ctx context.Context, i int) error {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/"+fmt.Sprint(i), nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		for i := range n {
			if err := call(t.Context(), i); err != nil {
				t.Fatal(err)
			}
		}
		var sums atomic.Int64
		testHookSum = func() { sums.Add(1) }
		defer func() { testHookSum = nil }()
		start := time.Now()
		items := func(yield func(int) bool) {
			for i := range n {
				if !yield(i) {
					return
				}
			}
		}
		err := ForEach(t.Context(), tr, items, call)
		if err != nil {
			t.Fatal(err)
		}
		if most := int64(time.Since(start)/fanoutEvery) + 1; sums.Load() > most {
			t.Errorf("%d sums of %d lanes' limits over %d items in %v, want at most %d", sums.Load(), n, n, time.Since(start), most)
		}
	})
}

// TestForEachMaxIntMinimum: WithConcurrency(math.MaxInt, math.MaxInt)
// bounds ForEach, before the Transport has a lane, by its minimum, which
// overflowed the bound: no item ever started.
func TestForEachMaxIntMinimum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithConcurrency(math.MaxInt, math.MaxInt))
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		var ran atomic.Int64
		err := ForEach(ctx, tr, slices.Values([]int{1, 2, 3}), func(ctx context.Context, _ int) error {
			ran.Add(1)
			return get(ctx, tr, "")
		})
		if err != nil || ran.Load() != 3 {
			t.Errorf("ForEach ran %d of 3 items and returned %v; want 3 and nil", ran.Load(), err)
		}
	})
}
