package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestErrorReplyIsNotAnOutage: a budget whose keys something else wrote
// with another type answers WRONGTYPE. That fails the calls for that key,
// with the reply, and nothing else: other keys stay on the shared budget,
// and nothing says Redis is unreachable.
func TestErrorReplyIsNotAnOutage(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	log := new(logs)
	b := newTokens(t, c, WithLogger(slog.New(log)), WithInFlight(8, time.Minute))
	ctx := context.Background()
	for _, k := range []string{"sluice:{bad}:tat", "sluice:{badcool}:cool"} {
		if err := c.HSet(ctx, k, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		w, err := b.Take(ctx, "bad", 10, 1)
		var re redis.Error
		if w != 0 || !errors.As(err, &re) || errors.Is(err, ErrUnavailable) ||
			!strings.Contains(err.Error(), "WRONGTYPE") || !strings.HasPrefix(err.Error(), "sluiceredis: ") {
			t.Fatalf("Take %d on a key holding a hash = %v, %v; want the WRONGTYPE reply", i, w, err)
		}
		// Another key is served by Redis, not by the fallback (whose
		// leases are not in Redis, and whose cap here is 2).
		if w, err := b.Take(ctx, "good", 1000, 100); w != 0 || err != nil {
			t.Fatalf("Take %d on a good key = %v, %v", i, w, err)
		}
	}
	if n := c.ZCard(ctx, "sluice:{good}:lease").Val(); n != 3 {
		t.Errorf("%d leases of the good key in Redis, want 3: it went to the fallback", n)
	}
	err := b.Cool(ctx, "badcool", time.Now().Add(time.Minute))
	if err == nil || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Cool on a key holding a hash: %v, want the WRONGTYPE reply", err)
	}
	// Done meets a lease key that turned into a hash after its Take.
	if w, err := b.Take(ctx, "later", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	c.Del(ctx, "sluice:{later}:lease")
	c.HSet(ctx, "sluice:{later}:lease", "f", "v")
	b.Done("later")
	if !healthy(b.backend) {
		t.Error("an error reply marked Redis down")
	}
	if n := log.count(slog.LevelWarn); n != 0 {
		t.Errorf("%d warnings logged for error replies, want none", n)
	}
	if w, err := b.Take(ctx, "good", 1000, 100); w != 0 || err != nil {
		t.Fatalf("Take on a good key at the end = %v, %v", w, err)
	}
	if n := c.ZCard(ctx, "sluice:{good}:lease").Val(); n != 4 {
		t.Errorf("%d leases of the good key in Redis, want 4", n)
	}
	giveBack(b)
}

// TestOOMIsAnOutage: a reply that says the server cannot serve any write
// (here OOM, with maxmemory below what it uses) sends the Backend to its
// fallback, logged once.
func TestOOMIsAnOutage(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	log := new(logs)
	b := newTokens(t, c, WithLogger(slog.New(log)))
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		// The fallback's budget starts empty, its first token due within
		// an interval of its rate: a quarter of 1000/s, slowed by up to
		// fallbackJitter.
		interval := 4 * time.Millisecond * 100 / time.Duration(100*(1-fallbackJitter))
		if w, err := b.Take(ctx, "api", 1000, 100); w > interval || err != nil {
			t.Fatalf("Take %d on an OOM Redis = %v, %v; want the fallback", i, w, err)
		}
	}
	if healthy(b.backend) {
		t.Error("Redis answering OOM is still taken as up")
	}
	if n := log.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}

// replyErr is an error reply made up for TestUnreachable.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func TestUnreachable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{redis.ErrClosed, true},
		{replyErr("LOADING Redis is loading the dataset in memory"), true},
		{replyErr("BUSY Redis is busy running a script."), true},
		{replyErr("READONLY You can't write against a read only replica."), true},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), true},
		{replyErr("MASTERDOWN Link with MASTER is down"), true},
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{replyErr("MISCONF Redis is configured to save RDB snapshots"), true},
		{replyErr("NOAUTH Authentication required."), true},
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{replyErr("CROSSSLOT Keys in request don't hash to the same slot"), false},
		{replyErr("ERR user_script:1: Script attempted to access nonexistent global variable"), false},
		{replyErr("NOPERM this user has no permissions to access one of the keys"), false},
		{redis.Nil, false},
		{fmt.Errorf("wrapped: %w", replyErr("WRONGTYPE x")), false},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
