package sluiceredis

import (
	"context"
	_ "embed"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
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

	//go:embed renew.lua
	renewSrc    string
	renewScript = redis.NewScript(renewSrc)

	//go:embed release.lua
	releaseSrc    string
	releaseScript = redis.NewScript(releaseSrc)

	//go:embed done.lua
	doneSrc    string
	doneScript = redis.NewScript(doneSrc)
)

// status is what take.lua decided.
type status int

const (
	taken     status = iota // the token (and lease) is the caller's now
	reserved                // the token (and lease) is the caller's from wait on
	cooling                 // a cooldown lasts wait longer; nothing taken
	full                    // every lease is held; ask again in wait
	cancelled               // the call's lease was cancelled before it ran (see release.lua)
)

// keys are the Redis keys of one budget, in take.lua's KEYS order: the
// GCRA state, the cooldown, the leases, the cancelled leases and the
// waiting marker (also the name of the channel releases are published on).
type keys [5]string

// newKeys names the keys of the budget named key: prefix + "{" + key +
// "}:" + a suffix, so that the three share key as their Redis Cluster hash
// tag (the text between the first '{' and the first '}' after it) and so
// one slot. A key that is empty or holds a brace would make an empty or a
// cut tag (an empty tag is ignored, and the keys would fall in different
// slots); it is written as "=" and its bytes in hex instead, and marked by
// a '=' after the closing brace too, which no key written as is can put
// there: prefix + "{=" + hex(key) + "}=:" + a suffix.
func newKeys(prefix, key string) keys {
	var base string
	if key == "" || strings.ContainsAny(key, "{}") {
		base = prefix + "{=" + hex.EncodeToString([]byte(key)) + "}=:"
	} else {
		base = prefix + "{" + key + "}:"
	}
	return keys{base + "tat", base + "cool", base + "lease", base + "gone", base + "freed"}
}

func (k keys) lease() string { return k[2] }

// shares names the hash of the processes' entries of a Backend (see
// share.lua), beside the budget's other keys and in their slot.
func (k keys) shares() string { return k[0][:len(k[0])-len("tat")] + "shares" }
func (k keys) gone() string   { return k[3] }

// recovery names the key share.lua sets while the shares recover from
// Redis losing entries.
func (k keys) recovery() string { return k[0][:len(k[0])-len("tat")] + "recovery" }

// moved names the channel on which share.lua names the processes that are
// to refresh now (see nudges).
func (k keys) moved() string { return k[0][:len(k[0])-len("tat")] + "moved" }
func (k keys) freed() string { return k[4] }

// takeArgs are take.lua's arguments other than the releases.
type takeArgs struct {
	rate     float64 // tokens per second; <= 0: not paced
	burst    int
	leases   int // cap; 0: none
	leaseTTL time.Duration
	member   string
	// want is the most tokens to take (0: one); those after the first
	// only if due within horizon. The i-th after the first takes the
	// lease member + "." + i.
	want    int
	horizon time.Duration
	self    string // the calling Backend, woken when a lease comes back
}

// maxWant bounds the tokens one take.lua call takes.
const maxWant = 64

// memberN names the lease of the i-th token (from 0) a take.lua call took
// under member.
func memberN(member string, i int) string {
	if i == 0 {
		return member
	}
	return member + "." + strconv.Itoa(i)
}

// The range of GCRA's arguments, in microseconds. take.lua keeps times in
// doubles, exact to a quarter microsecond today (see take.lua); these
// bounds keep every time it computes far below 2^53.
const (
	// minInterval paces rates above 1,000,000 a second at that rate.
	minInterval = 1.0
	// maxInterval (about 3.2 years) paces rates below one token in that
	// long at one token in that long.
	maxInterval = 1e14
	// maxTolerance caps the burst of a slow rate: interval x (burst-1) is
	// cut to about 3.2 years' worth of tokens.
	maxTolerance = 1e14
)

// gcra returns take.lua's emission interval and burst tolerance for rate
// and burst, in microseconds: 0, 0 when rate is not positive. The interval
// is not rounded to a whole microsecond, which would under-deliver a fast
// rate (600,000/s would get 83% of it).
func gcra(rate float64, burst int) (interval, tolerance float64) {
	if !(rate > 0) { // also NaN
		return 0, 0
	}
	interval = min(max(1e6/rate, minInterval), maxInterval)
	tolerance = min(interval*float64(max(burst, 1)-1), maxTolerance)
	return interval, tolerance
}

// maxRelease bounds the leases one script call gives back; the rest wait
// for the next call. (Lua's unpack fails beyond a few thousand values, and
// a long outage can queue many.)
const maxRelease = 256

// runTake runs take.lua: one round trip (two the first time a server sees
// the script: EVALSHA, then EVAL, which caches it). It returns the wait of
// each token taken (taken, reserved: the first says which), or the one
// wait of cooling and full; and for each token taken, how long after the
// call ran its theoretical arrival time is (see take.lua; nil if not
// paced).
func runTake(ctx context.Context, c redis.Scripter, k keys, a takeArgs, release []string) (status, []time.Duration, error) {
	st, waits, _, err := runTakeLate(ctx, c, k, a, release)
	return st, waits, err
}

// runTakeLate is runTake that also returns the theoretical arrival times.
func runTakeLate(ctx context.Context, c redis.Scripter, k keys, a takeArgs, release []string) (status, []time.Duration, []time.Duration, error) {
	interval, tolerance := gcra(a.rate, a.burst)
	args := make([]any, 0, 9+len(release))
	args = append(args,
		strconv.FormatFloat(interval, 'g', -1, 64),
		strconv.FormatFloat(tolerance, 'g', -1, 64),
		a.leases,
		a.leaseTTL.Microseconds(),
		a.member,
		fullWait.Microseconds(),
		min(max(a.want, 1), maxWant),
		a.horizon.Microseconds(),
		a.self)
	for _, r := range release {
		args = append(args, r)
	}
	v, err := takeScript.Run(ctx, c, k[:], args...).Int64Slice()
	if err != nil {
		return 0, nil, nil, err
	}
	bad := len(v) < 2 || v[0] < int64(taken) || v[0] > int64(cancelled) || slices.ContainsFunc(v[1:], func(w int64) bool { return w < 0 })
	n := 1
	if !bad && (status(v[0]) == taken || status(v[0]) == reserved) {
		n = (len(v) - 1) / 2
		bad = len(v) != 1+2*n || n < 1 || n > maxWant
	} else if len(v) != 2 {
		bad = true
	}
	if bad {
		return 0, nil, nil, fmt.Errorf("sluiceredis: take.lua returned %v", v)
	}
	waits := make([]time.Duration, n)
	for i, w := range v[1 : 1+n] {
		waits[i] = micros(w)
	}
	var lates []time.Duration
	if interval, _ := gcra(a.rate, a.burst); interval > 0 && len(v) == 1+2*n {
		lates = make([]time.Duration, n)
		for i, t := range v[1+n:] {
			lates[i] = micros(t)
		}
	}
	return status(v[0]), waits, lates, nil
}

// runDone runs done.lua: the leases ids are given back, and as many
// processes that wait for a lease are told.
func runDone(ctx context.Context, c redis.Scripter, k keys, ids []string) error {
	args := make([]any, 0, 1+len(ids))
	args = append(args, fullWait.Microseconds())
	for _, id := range ids {
		args = append(args, id)
	}
	return doneScript.Run(ctx, c, []string{k.lease(), k.freed()}, args...).Err()
}

// micros converts a wait from take.lua, saturating.
func micros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// maxCool is the longest cooldown shared through Redis. A longer one holds
// in full in the process that learned it; the others learn the rest from
// the server when it ends.
const maxCool = 24 * time.Hour

// runCool runs cool.lua: the cooldown is sent as a duration, not a time, so
// that it ends at the same instant for every process whatever their clocks.
// It gives back the leases in release with the same call.
func runCool(ctx context.Context, c redis.Scripter, k keys, d time.Duration, release []string) error {
	d = min(d, maxCool) // and so no overflow below
	// Rounded up, so that the shared cooldown never ends before the local one.
	us := (d + time.Microsecond - 1) / time.Microsecond
	args := make([]any, 0, 1+len(release))
	args = append(args, strconv.FormatInt(int64(us), 10))
	for _, r := range release {
		args = append(args, r)
	}
	return coolScript.Run(ctx, c, []string{k[1], k[2]}, args...).Err()
}

// runRenew runs renew.lua: the leases in ids that are still held expire ttl
// from now on the Redis server's clock.
func runRenew(ctx context.Context, c redis.Scripter, k keys, ttl time.Duration, ids []string) error {
	args := make([]any, 0, 1+len(ids))
	args = append(args, strconv.FormatInt(ttl.Microseconds(), 10))
	for _, id := range ids {
		args = append(args, id)
	}
	return renewScript.Run(ctx, c, []string{k.lease()}, args...).Err()
}

// runRelease runs release.lua: the leases ids, taken by calls that failed
// or timed out here and may or may not have run there, are removed if they
// were taken, and cancelled for ttl if their call is still to run.
func runRelease(ctx context.Context, c redis.Scripter, k keys, ttl time.Duration, ids []string) error {
	args := make([]any, 0, 1+len(ids))
	args = append(args, strconv.FormatInt(max(ttl.Microseconds(), 1), 10))
	for _, id := range ids {
		args = append(args, id)
	}
	return releaseScript.Run(ctx, c, []string{k.lease(), k.gone()}, args...).Err()
}
