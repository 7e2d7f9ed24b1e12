package sluiceredis

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/sluiceredis/internal/redistest"
)

// childEnv, when set, makes the test binary a child process of a
// multi-process test; its value names the child's role.
const childEnv = "SLUICEREDIS_TEST_CHILD"

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the tests kill Redis on purpose.
	redis.SetLogger(quiet{})
	if os.Getenv(childEnv) != "" {
		// A child of TestFleetProcesses: it runs one test and reports on
		// stdout; its goroutines are the parent's concern.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// newClient returns a client for addr that honours context deadlines, as
// New requires, and closes it when t ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		// The tests kill and pause Redis; retries would only blur the
		// timing they observe.
		MaxRetries: -1,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// newBackend is New that fails t on error. Its timeout is a second, not
// DefaultTimeout, so that a slow call on a busy test machine does not send
// a test that is not about the fallback to it (which would add the
// fallback share to the shared budget); tests of the fallback pass
// WithTimeout(DefaultTimeout), which comes later and wins.
func newBackend(t testing.TB, c redis.UniversalClient, opts ...Option) *Backend {
	t.Helper()
	b, err := New(c, append([]Option{WithTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		checkRenewerStops(t, b)
		// A Take that waited for a lease keeps its key's channel
		// subscribed for a while (see wakers): Close ends that.
		b.Close()
	})
	return b
}

// giveBack calls Done for every lease b holds, as the core would once the
// attempts are done, for tests that take leases they do not need to release
// one by one.
func giveBack(b *Backend) {
	b.mu.Lock()
	n := map[string]int{}
	for key, bg := range b.budgets {
		bg.mu.Lock()
		n[key] = len(bg.held)
		bg.mu.Unlock()
	}
	b.mu.Unlock()
	for key, k := range n {
		for range k {
			b.Done(key)
		}
	}
}

// checkRenewerStops fails t unless b's lease renewer stops within a second:
// a test must give back every lease it takes (as the core does for every
// attempt), or the renewer would outlive it.
func checkRenewerStops(t testing.TB, b *Backend) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); ; {
		b.mu.Lock()
		running := b.renewing
		b.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Error("the lease renewer still runs at the end of the test: a lease was not given back")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// withProbeEvery shortens the probe interval for tests that wait for one.
func withProbeEvery(d time.Duration) Option {
	return optionFunc(func(c *config) error { c.probeEvery = d; return nil })
}

// counter is a go-redis hook that counts round trips: one per command sent
// alone, one per pipeline.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// countCalls adds a counter to c.
func countCalls(c *redis.Client) *counter {
	n := new(counter)
	c.AddHook(n)
	return n
}

// logs is a slog.Handler that keeps every record, for tests that check
// what is logged and how often.
type logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}

// count returns how many records of level were logged.
func (l *logs) count(level slog.Level) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level {
			n++
		}
	}
	return n
}

// startRedis starts a redis-server for t (see redistest.Start).
func startRedis(t testing.TB) *redistest.Server {
	t.Helper()
	return redistest.Start(t)
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// takeUntil calls Take in a loop as a lane's dispatcher does (sleeping the
// wait it is given) until stop, and returns the times of the grants. Every
// grant is reported Done at once.
func takeUntil(t testing.TB, b *Backend, key string, rate float64, burst int, stop time.Time) []time.Time {
	t.Helper()
	var grants []time.Time
	for time.Now().Before(stop) {
		w, err := b.Take(context.Background(), key, rate, burst)
		if err != nil {
			t.Errorf("Take: %v", err)
			return grants
		}
		if w > 0 {
			time.Sleep(min(w, time.Until(stop)+time.Millisecond))
			continue
		}
		grants = append(grants, time.Now())
		b.Done(key)
	}
	return grants
}
