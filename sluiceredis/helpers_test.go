package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
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

// newTokens is NewTokens that fails t on error. Its timeout is a second,
// not DefaultTimeout, so that a slow call on a busy test machine does not
// send a test that is not about the fallback to it (which would add the
// fallback share to the shared budget); tests of the fallback pass
// WithTimeout(DefaultTimeout), which comes later and wins.
func newTokens(t testing.TB, c redis.UniversalClient, opts ...Option) *Tokens {
	t.Helper()
	b, err := NewTokens(c, append([]Option{WithTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		checkLeasesBack(t, b.backend)
		// A Take that waited for a lease keeps its key's channel
		// subscribed for a while (see wakers): Close ends that.
		b.Close()
	})
	return b
}

// newBackend is New that fails t on error, with a timeout of a second (see
// newTokens).
func newBackend(t testing.TB, c redis.UniversalClient, opts ...Option) *Backend {
	t.Helper()
	b, err := New(c, append([]Option{WithTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// giveBack calls Done for every lease b holds, as the core would once the
// attempts are done, for tests that take leases they do not need to release
// one by one.
func giveBack(b *Tokens) {
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

// checkLeasesBack fails t if b holds a lease for an attempt that was never
// Done: a test must give back every lease it takes (as the core does for
// every attempt), or the renewer would renew it for as long as b lives.
// (Leases of reservations nobody came for go back on their own when they
// go stale, and Close gives back the rest.)
func checkLeasesBack(t testing.TB, b *backend) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for key, bg := range b.budgets {
		bg.mu.Lock()
		n := len(bg.held) - bg.local
		bg.mu.Unlock()
		if n > 0 {
			t.Errorf("%d leases on %q were never given back (Done)", n, key)
		}
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

// cutter is a go-redis hook that fails every call while cut is set, as a
// network that drops them would; failed counts those calls.
type cutter struct {
	cut    atomic.Bool
	failed atomic.Int64
}

var errCut = errors.New("test: the network to Redis is cut")

func (c *cutter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cutter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.cut.Load() {
			c.failed.Add(1)
			cmd.SetErr(errCut)
			return errCut
		}
		return next(ctx, cmd)
	}
}

func (c *cutter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if c.cut.Load() {
			c.failed.Add(1)
			for _, cmd := range cmds {
				cmd.SetErr(errCut)
			}
			return errCut
		}
		return next(ctx, cmds)
	}
}

// cutCalls adds a cutter to c.
func cutCalls(c *redis.Client) *cutter {
	n := new(cutter)
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
func takeUntil(t testing.TB, b *Tokens, key string, rate float64, burst int, stop time.Time) []time.Time {
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

// waitRenewerStops waits until b's lease renewer has stopped, as it must
// once every lease is given back; a renewer that never stops fails the
// test by its timeout.
func waitRenewerStops(t testing.TB, b *backend) {
	t.Helper()
	for {
		b.mu.Lock()
		running := b.renewing
		b.mu.Unlock()
		if !running {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// healthy reports whether Redis is up for every key b has used.
func healthy(b *backend) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bg := range b.budgets {
		if !bg.health.up() {
			return false
		}
	}
	return true
}

// times returns when records of level naming key (their "key" attribute)
// were logged.
func (l *logs) times(level slog.Level, key string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Time
	for _, r := range l.recs {
		if r.Level != level {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "key" && a.Value.String() == key {
				out = append(out, r.Time)
				return false
			}
			return true
		})
	}
	return out
}

// callsScript reports whether cmd runs a script on a key whose name holds
// part (":budget:" for budget.lua, ":shares" for share.lua).
func callsScript(cmd redis.Cmder, part string) bool {
	name := strings.ToLower(cmd.Name())
	return (name == "evalsha" || name == "eval") && strings.Contains(fmt.Sprint(cmd.Args()), part)
}
