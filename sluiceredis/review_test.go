package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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
	b := newBackend(t, c, WithLogger(slog.New(log)), WithInFlight(8, time.Minute))
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
	if !b.health.up() {
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
}

// TestOOMIsAnOutage: a reply that says the server cannot serve any write
// (here OOM, with maxmemory below what it uses) sends the Backend to its
// fallback, logged once.
func TestOOMIsAnOutage(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	log := new(logs)
	b := newBackend(t, c, WithLogger(slog.New(log)))
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if w, err := b.Take(ctx, "api", 1000, 100); w != 0 || err != nil {
			t.Fatalf("Take %d on an OOM Redis = %v, %v; want the fallback", i, w, err)
		}
	}
	if b.health.up() {
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

// TestCoolFarAway: a cooldown centuries away (a Duration would overflow)
// is shared as 24 hours and holds in full here; Redis stays up.
func TestCoolFarAway(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b1, b2 := newBackend(t, c), newBackend(t, newClient(t, srv.Addr()))
	ctx := context.Background()
	far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := b1.Cool(ctx, "api", far); err != nil {
		t.Fatalf("Cool 8000 years away: %v", err)
	}
	if !b1.health.up() {
		t.Fatal("Cool far away marked Redis down")
	}
	w, err := b2.Take(ctx, "api", 10, 1)
	if err != nil || w <= maxCool-time.Minute || w > maxCool {
		t.Errorf("another process's Take = %v, %v; want about %v", w, err, maxCool)
	}
	if w, err := b1.Take(ctx, "api", 10, 1); err != nil || w < 100*365*24*time.Hour {
		t.Errorf("Take in the process that learned it = %v, %v; want the whole cooldown", w, err)
	}
	if ttl := c.PTTL(ctx, "sluice:{api}:cool").Val(); ttl <= maxCool-time.Minute || ttl > maxCool {
		t.Errorf("cooldown key PTTL %v, want about %v", ttl, maxCool)
	}
}

// TestCoolDropsReservations: a cooldown drops the reservations it covers
// and gives back their leases in the same call, so that when it ends the
// process takes no more than the burst the budget has regained.
func TestCoolDropsReservations(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newBackend(t, c, WithInFlight(10, time.Minute))
	ctx := context.Background()
	zcard := func() int64 { return c.ZCard(ctx, "sluice:{api}:lease").Val() }
	const rate, burst = 10, 2
	for i := range burst {
		if w, err := b.Take(ctx, "api", rate, burst); w != 0 || err != nil {
			t.Fatalf("Take %d = %v, %v", i, w, err)
		}
	}
	if w, err := b.Take(ctx, "api", rate, burst); w <= 0 || err != nil {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	if n := zcard(); n != 3 {
		t.Fatalf("%d leases, want 3 (2 granted, 1 reserved)", n)
	}
	if err := b.Cool(ctx, "api", time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n := zcard(); n != 2 {
		t.Errorf("%d leases after Cool, want 2: the dropped reservation's lease given back", n)
	}
	bg := b.budget("api")
	bg.mu.Lock()
	pending, release := len(bg.pending), len(bg.release)
	bg.mu.Unlock()
	if pending != 0 || release != 0 {
		t.Errorf("%d reservations and %d releases left after Cool, want none", pending, release)
	}
}

// TestCoolBurstAfterCooldown counts the grants right when a cooldown ends:
// no more than the burst, even though a token was reserved before it.
func TestCoolBurstAfterCooldown(t *testing.T) {
	srv := startRedis(t)
	b := newBackend(t, newClient(t, srv.Addr()))
	ctx := context.Background()
	const rate, burst = 10, 2
	for range burst {
		b.Take(ctx, "api", rate, burst)
	}
	if w, err := b.Take(ctx, "api", rate, burst); w <= 0 || err != nil {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	if err := b.Cool(ctx, "api", time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	w, err := b.Take(ctx, "api", rate, burst)
	if err != nil || w <= 0 {
		t.Fatalf("Take during the cooldown = %v, %v", w, err)
	}
	time.Sleep(w)
	grants := 0
	for {
		w, err := b.Take(ctx, "api", rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		if w > 0 {
			break
		}
		grants++
		if grants > 10 {
			t.Fatal("no end to the grants")
		}
	}
	if grants > burst {
		t.Errorf("%d grants at the end of a cooldown, over the burst of %d", grants, burst)
	}
}

// TestDoneGivesBackStaleLeases: a reservation nobody came for gives its
// lease back with the next Done, when no Take follows.
func TestDoneGivesBackStaleLeases(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newBackend(t, c, WithInFlight(5, time.Minute))
	ctx := context.Background()
	zcard := func() int64 { return c.ZCard(ctx, "sluice:{api}:lease").Val() }
	if w, err := b.Take(ctx, "api", 20, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	w, err := b.Take(ctx, "api", 20, 1)
	if err != nil || w <= 0 {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	// Well past the reservation's staleness allowance of 50ms.
	time.Sleep(w + 200*time.Millisecond)
	b.Done("api")
	if n := zcard(); n != 0 {
		t.Errorf("%d leases after Done with a stale reservation, want 0", n)
	}
}

// TestReleasesAreBounded: a long outage can queue more releases than one
// script call can take (Lua's unpack fails beyond about 8000); they go a
// bounded number per call.
func TestReleasesAreBounded(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newBackend(t, c, WithInFlight(5, time.Minute))
	ctx := context.Background()
	bg := b.budget("api")
	const queued = 10000
	for i := range queued {
		bg.release = append(bg.release, "gone:"+strconv.Itoa(i))
	}
	for i := 1; i <= 3; i++ {
		if w, err := b.Take(ctx, "api", 0, 1); w != 0 || err != nil {
			t.Fatalf("Take with %d releases queued = %v, %v", queued, w, err)
		}
		bg.mu.Lock()
		left := len(bg.release)
		bg.mu.Unlock()
		if left != queued-i*maxRelease {
			t.Fatalf("%d releases left after %d Takes, want %d", left, i, queued-i*maxRelease)
		}
	}
	if !b.health.up() {
		t.Error("Redis marked down")
	}
}

// TestPacingPrecision runs take.lua at 300,000/s against a state far ahead
// of the clock, so that every call reserves: the state moves on by about
// one interval (1e6/300000 = 3.33us) per call, never less, rather than by
// a whole microsecond rounded up (4us, 83% of the rate).
func TestPacingPrecision(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	k := newKeys(DefaultPrefix, "api")
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	start := float64(now.UnixMicro() + 1e9)
	c.Set(ctx, k[0], strconv.FormatFloat(start, 'f', 0, 64), time.Hour)
	const rate, n = 300000.0, 1000
	for i := range n {
		if st, _, err := runTake(ctx, c, k, takeArgs{rate: rate, burst: 1}, nil); st != reserved || err != nil {
			t.Fatalf("call %d: %v, %v; want a reservation", i, st, err)
		}
	}
	v, err := c.Get(ctx, k[0]).Float64()
	if err != nil {
		t.Fatal(err)
	}
	step, interval := (v-start)/n, 1e6/rate
	t.Logf("state moved %.4fus per token at %v/s (interval %.4fus)", step, rate, interval)
	if step < interval || step > 1.06*interval {
		t.Errorf("state moved %.4fus per token, want [%.4f, %.4f]", step, interval, 1.06*interval)
	}
}

// TestGCRARange: a tiny rate with a huge burst must not overflow.
func TestGCRARange(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{1e-9, 1 << 40}, {1e-300, 1 << 62}, {1e12, 1}, {5, 1 << 62}} {
		iv, tol := gcra(tc.rate, tc.burst)
		if !(iv >= minInterval && iv <= maxInterval && tol >= 0 && tol <= maxTolerance) {
			t.Errorf("gcra(%v, %v) = %v, %v; out of range", tc.rate, tc.burst, iv, tol)
		}
	}
	srv := startRedis(t)
	b := newBackend(t, newClient(t, srv.Addr()))
	ctx := context.Background()
	// One a day, burst 50: the whole burst at once, then a day's wait.
	for i := range 50 {
		if w, err := b.Take(ctx, "daily", 1.0/86400, 50); w != 0 || err != nil {
			t.Fatalf("Take %d of the burst at one a day = %v, %v; want 0, nil", i, w, err)
		}
	}
	if w, err := b.Take(ctx, "daily", 1.0/86400, 50); err != nil || w < 23*time.Hour || w > 24*time.Hour {
		t.Fatalf("Take past the burst at one a day = %v, %v; want a day", w, err)
	}
	// One in 31 years, burst 2^40: cut to about 3 years' worth, which is
	// two tokens; then a wait, with no overflow on the way.
	for i := range 2 {
		if w, err := b.Take(ctx, "api", 1e-9, 1<<40); w != 0 || err != nil {
			t.Fatalf("Take %d of a huge burst at a tiny rate = %v, %v; want 0, nil", i, w, err)
		}
	}
	if w, err := b.Take(ctx, "api", 1e-9, 1<<40); err != nil || w < 365*24*time.Hour {
		t.Fatalf("Take past the cut burst = %v, %v; want years", w, err)
	}
}

// keySlot is Redis Cluster's slot of key: CRC16 (XMODEM) of its hash tag,
// or of the whole key when it has no non-empty tag, mod 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// TestKeysShareASlot: the three keys of any budget fall in one Cluster
// slot, whatever braces its name holds, and different names never share
// keys.
func TestKeysShareASlot(t *testing.T) {
	// The values Redis's documentation gives for CLUSTER KEYSLOT.
	if keySlot("somekey") != 11058 || keySlot("foo{hash_tag}") != keySlot("hash_tag") {
		t.Fatalf("keySlot is wrong: somekey %d", keySlot("somekey"))
	}
	names := []string{"", "}", "}x", "x}", "a}b", "{", "{}", "a{b}c", "{a}", "x", "7d",
		"=7d", "api.example.com:443", "é{}"}
	seen := map[string]string{}
	for _, name := range names {
		k := newKeys(DefaultPrefix, name)
		for _, key := range k[1:] {
			if keySlot(key) != keySlot(k[0]) {
				t.Errorf("budget %q: %q in slot %d, %q in slot %d", name, k[0], keySlot(k[0]), key, keySlot(key))
			}
		}
		for _, key := range k {
			if other, ok := seen[key]; ok {
				t.Errorf("budgets %q and %q share the key %q", name, other, key)
			}
			seen[key] = name
		}
	}
	if k := newKeys("app:", "}"); k[0] != "app:{=7d}=:tat" {
		t.Errorf("the keys of %q are %q", "}", k)
	}
	if k := newKeys("app:", "api"); k[0] != "app:{api}:tat" {
		t.Errorf("the keys of %q are %q", "api", k)
	}
}
