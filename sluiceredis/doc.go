// Package sluiceredis keeps sluice's budgets in Redis, so that a fleet of
// processes calling an API with one key shares one rate limit instead of
// each spending the whole of it.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
//	b, err := sluiceredis.New(rdb)
//	...
//	tr, err := sluice.New(nil, sluice.WithRate(500, time.Minute), sluice.WithBackend(b))
//
// Every process that uses the same Redis, the same prefix and the same lane
// key (the URL host by default) draws on one budget: together they send at
// most rate x T + burst requests in any window T, and together they can use
// all of the rate. Each process still orders its own waiters by priority and
// still learns the rate from the server; a cooldown one process learns from
// a Retry-After reaches the others through Redis.
//
// # How
//
// One Lua script decides an admission in one round trip, on the Redis
// server's clock (so process clocks do not matter): it checks the key's
// shared cooldown, then its in-flight leases (WithInFlight), then runs GCRA.
// A token not yet due is reserved for the asking process, which sends when
// it is due: each admitted request costs exactly one Redis call, however
// many processes contend. With WithInFlight, Done costs one more call, to
// release the lease, and each key with leases held costs one call every
// third of the lease ttl, to renew them (which needs Redis 6.2 or later,
// for ZADD GT; the rest runs on older versions too, though this package is
// tested on Redis 7 only). Keys are named prefix + "{" + key + "}" + a suffix (a
// Redis Cluster hash tag, so that one budget lives in one slot; see
// WithPrefix for keys with braces) and expire when idle.
//
// Processes share one budget per key, whatever rate each passes to it:
// while they disagree (one has learned a lower rate from the server, the
// others not yet), the fleet is bounded by the highest rate any of them
// passes. A cooldown (Cool) reaches another process at its next Take that
// asks Redis; a token it reserved before may still be sent in between.
//
// # When Redis is down
//
// Every call is bounded by WithTimeout (DefaultTimeout, 50ms). When Redis
// does not answer, a Backend falls back to a local budget of
// WithFallbackShare of the rate (DefaultFallbackShare, a quarter), logs
// once, tries Redis again once a second, and logs once more when it is
// back. No request waits on a dead Redis for more than the timeout. A fleet
// that loses Redis loses it at the same instant, so each process's local
// budget starts empty at a random phase of its interval and runs up to 5%
// below its share (a random factor drawn per outage): the processes do not
// send in step, and with a share of 1/N each the fleet of N stays within
// rate x T + burst + (N - 1) in any window T during the outage. With
// WithFallbackShare(0) it refuses instead: Take returns an error wrapping
// ErrUnavailable, and sluice fails the request with it. An error reply
// about one call (such as WRONGTYPE, when something else wrote a budget's
// key) is not an outage: it fails that call only (see Backend.Take).
//
// A call that times out on a stalled Redis is still in the server's input,
// and runs when the server resumes. Each lease is taken under a member
// unique to its call, so the Backend gives back the lease such a call may
// have taken, from a goroutine, as soon as Redis answers again; and a call
// that runs after that release takes nothing. So a stall costs the fleet
// its length and a round trip, not the lease ttl. (Its token, if it took
// one, is spent: GCRA cannot take a token back safely.)
//
// # Leases, shutdown and crashes
//
// Close gives back every lease a Backend holds and stops its goroutines;
// call it when the process shuts down, after its Transports are done.
// A process that dies without Close (killed, crashed, or cut off from
// Redis) cannot give its leases back: they expire on the Redis clock
// within the ttl passed to WithInFlight. That ttl is a trade-off. A short
// one frees a dead process's places sooner, but costs each live process one
// renewal call per key every ttl/3 while it holds leases, and a Redis stall
// or partition longer than the ttl lets a live process's leases expire, so
// that for the rest of its attempts the fleet may have more in flight than
// the cap. A long one costs a dead process's places for that long. 30
// seconds suits most fleets: a crash costs at most 30 s of the crashed
// process's places, and a stall under 30 s never breaks the cap.
package sluiceredis
