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
// # Shares or tokens
//
// A Backend works in one of two modes. By default it takes tokens from
// Redis as requests need them (below, "How"): the bound is exact (rate x T
// + burst in any window T), but a request pays a Redis round trip unless
// its token was taken ahead, priority is decided inside each process
// only, and WithInFlight adds a call per request in Done.
//
// With WithShares(refresh) it leases shares instead. Every refresh
// (DefaultRefresh, 1s, is a good start), each process tells Redis what its
// lanes on a key want at each priority level (a smoothed rate of arrivals
// plus its queue; a Normal or Batch queue asks for the whole rate, as a
// closed loop of workers uses whatever it gets), and one script call
// (share.lua, on that key's hash slot) grants it a share of the key's rate,
// and with WithInFlight of its places in flight, for three refreshes. The
// budget is apportioned by priority first (a level's wants across the
// fleet are met before any lower level's), max-min fairly within a level,
// and what nobody wants is spread evenly. A process is never granted more
// than the other processes' grants leave. A share moves without waiting
// for the refreshes at their turn: a process owed a share that others hold
// has them named on a channel of the key, and they refresh at once and give
// it up; and a refresh that leaves part of the rate unheld grants it, in
// the same call, to the processes owed it, and tells them their new rate
// on the channel (each Backend subscribes to the channels of its keys, on
// one connection). A process refreshes at most once a quarter of a refresh
// for such names (about 2.2 calls a second a process, one Interactive and
// three Batch processes at 100/s). An Interactive queue is asked for on
// top of its smoothed arrival rate, to be served within two refreshes; one
// that holds more than a quarter of a refresh's arrivals is urgent, asked
// for to be served within half a refresh, and its process looks for one
// eight times a refresh, locally, and refreshes at once when it finds it:
// so the Interactive grant stays close to its use (what it is granted and
// does not use is idle until its next refresh), and a burst of its calls
// waits about a quarter of a refresh, not one. Between refreshes the lanes
// pace themselves locally inside their shares (a lane's share is its part of
// its process's, by the same rule), with no Redis call per request, in
// Done or anywhere on a request's path; a key's first request waits for
// its first refresh. Several Transports may share one Backend: each of
// their lanes gets its own part.
//
// The bound with shares: the fleet sends at most rate x T + burst + 2N in
// any window T, for N processes. Each process's share has a burst of its
// fraction of the burst rounded down, at least one token (at most one
// token more than its fraction, per process); and each lane charges a
// late wake-up's token up to one token's time early (one more). On top of
// that, a share that moves is cut in the old holder when its reply arrives,
// and may be granted to the new one as soon as the same call's message
// reaches it, so the overlap is at most a round trip of the share that
// moves (a tenth of a token for 10/s moved with Redis 5ms away each way).
// Moving shares between refreshes changes none of this. A refresh whose
// reply is lost (a Redis stall longer than WithTimeout) may leave its
// process sending at its previous share, for at most the rest of its
// lease, while Redis has recorded a smaller one; a message lost costs only
// the wait for the next refresh. A Redis that loses its data (restarted
// empty) forgets the shares held: see "When Redis is down".
//
// A key is refreshed for as long as a lane on it lives: an idle lane until
// its Transport forgets it (sluice.WithLaneIdle, 5 minutes by default).
//
// Costs: one script call per key per process per refresh (about 1.7 a
// second a process with the jitter and the early refreshes of a process
// that is owed a share; at most four a refresh while shares move, see
// above), whatever the request rate, and one subscription connection per
// Backend; Redis time for each
// call grows with the number of live processes on the key (the script
// reads every entry). A distant Redis costs nothing in throughput.
//
// Token mode costs more calls than shares: about one per request (fewer
// for a lane that sends several per round trip, which takes them ahead),
// and with WithInFlight a second, to release the lease (sluice makes it
// from a goroutine of its own, not inside the response body's Close). A
// lane that finds every place in flight taken does not ask again on a
// fixed period: it waits until a release wakes it (see "How"). Several
// Transports may share one Backend in either mode: tokens taken ahead are
// kept for the Transport whose lane took them (see sluice.TakerOf).
//
// In token mode Redis's health is one for the Backend: on a Redis Cluster a
// dead master sends every key of the Backend to its local fallback (which
// keeps each within its bound), not only its own keys.
//
// Pick tokens for a small fleet against a strict server, where the exact
// bound matters more than the round trip; pick shares for a large fleet, a
// high rate, a distant Redis, fleet-wide priority, or a Redis Cluster.
//
// Shares when Redis is down: a process keeps its last share until its
// lease (three refreshes) ends, trying Redis once a refresh; then it
// falls back to a local share of the rate divided by the number of
// processes at its last refresh (WithFallbackShare of it if it never had
// one), 95-100% of it at random per outage so that processes do not send
// in step. The first refresh that Redis answers ends the fallback, and
// takes no more than the fallback's rate: Redis has forgotten the
// entries meanwhile (they expired on its clock, or it restarted empty).
// Health is per key, so on a Redis Cluster a dead master sends only its
// own keys to the fallback.
//
// # How
//
// In token mode, one Lua script decides an admission in one round trip, on the Redis
// server's clock (so process clocks do not matter): it checks the key's
// shared cooldown, then its in-flight leases (WithInFlight), then runs GCRA.
// A token not yet due is reserved for the asking process, which sends when
// it is due: each admitted request costs at most one Redis call, however
// many processes contend. A lane that has been sending more than one
// request per round trip takes more than one token with the call: as many
// as it used in about one and a half horizons, where the horizon is two
// round trips, of those due within the horizon; they are reserved for that
// lane (of that Transport), and its next Takes are answered without Redis
// until they run out. So a distant Redis costs a lane no throughput (one
// process at 200/s with Redis 5ms away each way: 0.45 of the rate when a
// call took one token, 1.000 now, at 0.13 calls a request). Each token
// may be sent until its theoretical arrival time (its due time plus the
// burst's tolerance), which keeps the bound; a lane that wakes up later
// than that sends one such late token, as when a call took one token, and
// drops its other late ones. A token taken ahead and not used in time
// (the lane's demand stopped) is dropped too: lost to the fleet, at most
// what the lane used in about three round trips.
//
// With WithInFlight, a Take that finds every place taken lines its process
// up in Redis, and waits for a release on a channel it subscribes to (one
// connection per Backend, while it waits on some key and for 10 s after):
// each lease given back wakes the process that waited longest, whose Take
// asks once more. A Take that is not woken asks again after 250ms at most
// (a lease that expired wakes nobody). Four processes over a cap of 4, on
// calls of 200ms: 12.0 Redis calls a request when waiting lanes asked
// every 20ms, 3.1 now (the Take that waits, the one that takes, the
// release). On a Redis Cluster the channel is an ordinary one, which
// PUBLISH sends to every node.
//
// With WithInFlight, Done costs one more call, to
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
