package sluiceredis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
	b := newTokens(t, newClient(t, srv.Addr()))
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
