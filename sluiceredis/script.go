package sluiceredis

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts are this package's own rather than
// github.com/go-redis/redis_rate's. redis_rate runs GCRA alone: checking a
// shared cooldown and taking an in-flight lease as well would cost two more
// round trips per request, and the three checks would not be atomic (a
// token could be spent on a request that then finds no lease). And it
// refuses a token that is not yet due, telling only when to retry: every
// process of a fleet then retries at the same instant, one wins, and the
// others pay a round trip for nothing, so the Redis calls per request grow
// with the fleet. take.lua instead reserves a token that is not yet due
// (GCRA's virtual scheduling: the caller owns it and sends when it is due),
// so each admitted request costs exactly one call.
var (
	//go:embed take.lua
	takeSrc    string
	takeScript = redis.NewScript(takeSrc)

	//go:embed cool.lua
	coolSrc    string
	coolScript = redis.NewScript(coolSrc)
)

// status is what take.lua decided.
type status int

const (
	taken    status = iota // the token (and lease) is the caller's now
	reserved               // the token (and lease) is the caller's from wait on
	cooling                // a cooldown lasts wait longer; nothing taken
	full                   // every lease is held; ask again in wait
)

// keys are the Redis keys of one budget, in take.lua's KEYS order.
type keys [3]string

func newKeys(prefix, key string) keys {
	base := prefix + "{" + key + "}:"
	return keys{base + "tat", base + "cool", base + "lease"}
}

func (k keys) lease() string { return k[2] }

// takeArgs are take.lua's arguments other than the releases.
type takeArgs struct {
	rate     float64 // tokens per second; <= 0: not paced
	burst    int
	leases   int // cap; 0: none
	leaseTTL time.Duration
	member   string
}

// runTake runs take.lua: one round trip (two the first time a server sees
// the script: EVALSHA, then EVAL, which caches it).
func runTake(ctx context.Context, c redis.Scripter, k keys, a takeArgs, release []string) (status, time.Duration, error) {
	var interval, tolerance int64
	if a.rate > 0 {
		// Rounded up: a budget a microsecond slow per token is safe; one a
		// fraction fast would overshoot over a long run.
		interval = int64(min(math.Ceil(1e6/a.rate), 1e15))
		tolerance = interval * int64(max(a.burst, 1)-1)
	}
	args := make([]any, 0, 6+len(release))
	args = append(args,
		interval,
		tolerance,
		a.leases,
		a.leaseTTL.Microseconds(),
		a.member,
		leasePoll.Microseconds())
	for _, r := range release {
		args = append(args, r)
	}
	v, err := takeScript.Run(ctx, c, k[:], args...).Int64Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(v) != 2 || v[0] < int64(taken) || v[0] > int64(full) || v[1] < 0 {
		return 0, 0, fmt.Errorf("sluiceredis: take.lua returned %v", v)
	}
	return status(v[0]), time.Duration(v[1]) * time.Microsecond, nil
}

// runCool runs cool.lua: the cooldown is sent as a duration, not a time, so
// that it ends at the same instant for every process whatever their clocks.
func runCool(ctx context.Context, c redis.Scripter, k keys, d time.Duration) error {
	// Rounded up, so that the shared cooldown never ends before the local one.
	us := (d + time.Microsecond - 1) / time.Microsecond
	return coolScript.Run(ctx, c, k[1:2], strconv.FormatInt(int64(us), 10)).Err()
}
