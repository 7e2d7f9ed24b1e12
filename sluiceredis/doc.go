// Package sluiceredis keeps sluice's budgets in Redis, so that a fleet of
// processes calling an API with one key shares one rate limit instead of
// each spending the whole of it.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
//	b, err := sluiceredis.New(rdb)
//	...
//	defer b.Close()
//	tr, err := sluice.New(nil, sluice.WithRate(500, time.Minute), sluice.WithBackend(b))
//
// Every process that uses the same Redis, the same prefix and the same lane
// key (the URL host by default) draws on one budget, and together they can
// use all of its rate. Each process still orders its own waiters by
// priority and still learns the rate from the server; a cooldown one
// process learns from a Retry-After reaches the others through Redis. A
// sub-limit given a rate with sluice.WithSublimitRate (a model's requests
// per minute) is shared the same way, as a budget of its own.
//
// # Backend or Tokens
//
// New returns a Backend, which leases shares: every refresh (WithRefresh,
// a second by default) each process asks Redis for its share of each key's
// rate, by what its lanes want at each priority level, and its lanes pace
// themselves inside their shares with no Redis call per request. The fleet
// sends at most rate x T + burst + 2N in any window T, for N processes;
// priority holds across the fleet (a process's Interactive requests are
// served before any process's Batch ones, less the low share); a distant
// Redis costs no throughput; and a Redis Cluster that loses a master
// affects only the keys on it.
//
// NewTokens returns Tokens, which take a token per request: one Lua script
// call decides each admission on the Redis server's clock, so the fleet
// sends at most rate x T + burst in any window T, plus one late token per
// lane at most (see "How Tokens take"), at the cost of about one Redis call
// per request (and with WithInFlight a second, in Done); priority holds
// inside each process only. Against a server that refuses the first
// request over a small burst, that tight bound is what keeps a fleet from
// being refused: three processes at 50/s against an upstream with a burst
// of 2 (go run ./examples/fleet -procs 3 -burst 2) send about
// 1.00 of the rate with no refusal with Tokens (-tokens), while the
// Backend's processes, each pacing its own share at its own phase, meet
// on the server a few times a second, and each refusal's Retry-After of a
// second pauses the fleet. With a burst of 10 (the example's default) the
// Backend sends 1.00 of the rate with no refusal too.
//
// Use a Backend unless the server's burst is smaller than about twice the
// number of processes; then use Tokens.
//
// # How a Backend leases
//
// Every refresh, each process tells Redis what its lanes on a key want at
// each priority level, and one script call (share.lua, on that key's hash
// slot) grants it a share of the key's rate, and with WithInFlight of its
// places in flight, for three refreshes. A level wants its smoothed rate of
// arrivals plus its queue, to be served within two refreshes; a Normal or
// Batch queue asks for the whole rate, as a closed loop of workers uses
// whatever it gets. An Interactive queue that held eight or more at every
// look for half a refresh (its process looks eight times a refresh) is
// backed up: it asks for what it was let send since the last refresh and
// for its queue within half a refresh, so a process whose Interactive
// demand exceeds its share grows it by its queue twice a refresh (one
// process of 16 Interactive workers beside three Batch ones on 100/s: 30
// to 72 in the first second, 87 to 90 in the second, 90 from the third;
// go test -run TestSharesPriorityConverges -v). The budget is apportioned
// by priority first (a level's wants across the fleet are met before any
// lower level's), except that while a level below another wants some, the
// levels below the highest that wants are first given their part of the
// rate by their lanes' sluice.WithLowShare (a tenth by default, in equal
// parts between them); max-min fairly within a level, and what nobody
// wants is spread evenly. A process is never granted more than the other
// processes' grants leave. A share moves without
// waiting for the refreshes at their turn: a process owed a share that
// others hold has them named on a channel of the key, and they refresh at
// once and give it up; and a refresh that leaves part of the rate unheld
// grants it, in the same call, to the processes owed it, and tells them
// their new rate on the channel (each Backend subscribes to the channels
// of its keys, on one connection). A process refreshes at most once a
// quarter of a refresh for such names. An Interactive queue that holds more
// than a quarter of a refresh's arrivals is urgent, asked for to be served
// within half a refresh, and its process looks for one eight times a
// refresh, locally, and refreshes at once when it finds it: so a burst of
// Interactive calls waits about a quarter of a refresh, not one. Between
// refreshes the lanes pace themselves locally inside their shares (a
// lane's share is its part of its process's, by the same rule), with no
// Redis call per request, in Done or anywhere on a request's path; a key's
// first request waits for its first refresh (one round trip). Several
// Transports may share one Backend: each of their lanes gets its own part.
//
// The bound: the fleet sends at most rate x T + burst + 2N in any window
// T, for N processes. Each process's share has a burst of its fraction of
// the burst rounded down, at least one token (at most one token more than
// its fraction, per process); and each lane charges a late wake-up's token
// up to one token's time early (one more). On top of that, a share that
// moves is cut in the old holder when its reply arrives, and may be
// granted to the new one as soon as the same call's message reaches it, so
// the overlap is at most a round trip of the share that moves. A refresh
// whose reply is lost (a Redis stall longer than WithTimeout) may leave its
// process sending at its previous share while Redis has recorded a
// smaller one, until its next call, a quarter of a refresh later: that call
// records the share the process still holds (and, after its lease, its
// fallback), and its entry holds it until a reply comes, however many
// replies are lost. A message lost costs only the wait for the next
// refresh. A Redis that loses the entries (restarted empty, flushed, or a
// failover that lost the latest writes), though no call fails, holds the
// fleet to the shares it holds for a lease: see "When Redis is down".
//
// A key is refreshed for as long as a lane on it lives and wants something.
// A key whose lanes had nothing waiting, in flight or granted at three
// refreshes in a row is parked: its process gives its share back to the
// fleet and makes no call for it, and its lanes keep one token, so that
// the next request is sent at once; the process looks at its parked keys'
// lanes (locally) ten times a refresh and refreshes a key as soon as one
// has a request. A key whose lanes have budgets (sluice.WithBudget) is not
// parked.
//
// Costs: one script call per busy key per process per refresh (at most
// four a refresh while shares move), whatever the request rate; none for
// a parked key; one subscription connection per Backend. A process's
// refreshes are aligned to a twentieth of a refresh, and on a single Redis
// (a *redis.Client) those due together are sent in pipelines of up to 64,
// so a process with many busy keys makes at most a few round trips per
// twentieth of a refresh. Redis time for each call grows with the number
// of live processes on the key (the script reads every entry). go run
// ./cmd/scale prints round trips, script runs and Redis CPU for 64
// processes on one key and for 10,000 keys in a process.
//
// Budgets (sluice.WithBudget) are shared with the rate: each refresh a
// process is granted a part of each of the key's budgets by what its lanes
// want beyond what they hold (one more script call a refresh, budget.lua),
// and a response's count of what remains (OpenAI's
// x-ratelimit-remaining-tokens, which counts the whole organisation) sets
// the fleet's level, less the costs granted across the fleet and not yet
// answered. What a process held is given back when its entry expires
// (three refreshes after its last), and its unanswered costs stop
// counting. See BudgetDemand in package sluice, and docs/fleet.md.
//
// A Backend when Redis is down for a key: a process keeps its last share
// until its lease (three refreshes) ends, trying Redis once a refresh;
// then it falls back to a local share of the rate divided by the number of
// processes at its last refresh (WithFallbackShare of it if it never had
// one), 95-100% of it at random per outage so that processes do not send
// in step. The first refresh that Redis answers ends the fallback; it
// takes no more than the share the process held (the fallback's rate, or
// its lease's if the lease outlasted the outage): Redis may have
// forgotten the entries meanwhile (they expired on its clock, it restarted
// empty, or a failover lost them) while the other processes still send at
// their fallback rates until they reach it again. No caller
// sees an error. Health is per key, so on a Redis Cluster a dead master
// sends only its own keys to the fallback; and a key whose call failed
// has the client reload its map of the slots and is tried again four times
// a refresh for twice its lease, then once a refresh, so that it is back
// within about a refresh of its replica taking over (82-576ms in six runs
// at a refresh of 500ms; go test -run TestClusterFailover -v). Give a
// ClusterClient DialerRetries: 1, so that a call to a dead master fails at
// once rather than after go-redis's five dials, or at WithTimeout.
//
// A process whose refresh finds its entry gone (missing, expired, or of an
// older version: Redis restarted empty or was flushed, or a failover, an
// eviction or an outage lost it) knows that Redis may have lost the
// others' entries too, while their processes still send at their shares:
// Redis, which knows of no one else, would grant the first to ask the
// whole rate. So for a lease from then (three refreshes: every share held
// before the loss has ended or been renewed by then) no process is
// granted more than it holds, a process that holds nothing (new on the
// key, or parked) is granted nothing, and rate that nobody holds is not
// handed out; then shares move again as usual. Three processes holding a
// third each of 100/s through a FLUSHALL hold 100/s at most (go test -run
// TestSharesAfterRedisLosesThem -v). Redis cannot tell a loss from a new
// key: a process that holds nothing and asks first after the loss is
// granted what the others hold, until their next refreshes.
//
// # How Tokens take
//
// One Lua script decides an admission in one round trip, on the Redis
// server's clock (so process clocks do not matter): it checks the key's
// shared cooldown, then its in-flight leases (WithInFlight), then runs GCRA.
// A token not yet due is reserved for the asking process, which sends when
// it is due: each admitted request costs at most one Redis call, however
// many processes contend. A lane that has been sending more than one
// request per round trip takes more than one token with the call: as many
// as it used in about one and a half horizons, where the horizon is two
// round trips, of those due within the horizon; they are reserved for that
// lane (of that Transport), and its next Takes are answered without Redis
// until they run out, so a distant Redis costs a busy lane fewer calls a
// request than one. (A lane at a few requests per round trip still pays
// the round trip for most of them: Tokens suit a low rate.) Each token
// may be sent until its theoretical arrival time (its due time plus the
// burst's tolerance), which keeps the bound; a lane that wakes up later
// than that sends one such late token, as when a call took one token, and
// drops its other late ones. A token taken ahead and not used in time
// (the lane's demand stopped) is dropped too: lost to the fleet, at most
// what the lane used in about three round trips.
//
// With WithInFlight, a Take that finds every place taken lines its process
// up in Redis, and waits for a release on a channel it subscribes to (one
// connection per Tokens, while it waits on some key and for 10 s after):
// each lease given back wakes the process that waited longest, whose Take
// asks once more. A Take that is not woken asks again after 250ms at most
// (a lease that expired wakes nobody). Four processes over a cap of 4, on
// calls of 200ms, make about 3 Redis calls a request (the Take that waits,
// the one that takes, the release). On a Redis Cluster the channel is an ordinary one, which
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
// # When Redis is down for Tokens
//
// Every call is bounded by WithTimeout (DefaultTimeout, 50ms). When Redis
// does not answer for a key, Tokens fall back to a local budget of
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
// key) is not an outage: it fails that call only (see Tokens.Take).
// Health is per key, as for a Backend: on a Redis Cluster a dead master
// sends only its own keys to the fallback, and one Take a second per key
// tries it again (four a second on a Cluster, whose map of the slots is
// reloaded meanwhile, so that a key is back within a second of a
// failover).
//
// A call that times out on a stalled Redis is still in the server's input,
// and runs when the server resumes. Each lease is taken under a member
// unique to its call, so Tokens give back the lease such a call may
// have taken, from a goroutine, as soon as Redis answers again; and a call
// that runs after that release takes nothing. So a stall costs the fleet
// its length and a round trip, not the lease ttl. (Its token, if it took
// one, is spent: GCRA cannot take a token back safely.)
//
// # Leases, shutdown and crashes
//
// A Backend's Close gives its shares back to the fleet, and Tokens' Close
// gives back every lease they hold; both stop their goroutines. Call it
// when the process shuts down, after its Transports are done. A Backend
// that dies without Close holds its shares, and its places in flight,
// until their lease (three refreshes) ends. Tokens that die without Close (killed, crashed, or cut off from
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
