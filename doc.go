// Package sluice is an http.RoundTripper for calling APIs that publish a
// rate limit. It paces requests to the allowance, bounds what is in flight,
// serves interactive requests ahead of batch ones, and obeys what the server
// says about its limits.
//
//	tr, err := sluice.New(nil, sluice.WithRate(500, time.Minute))
//	if err != nil { ... }
//	client := &http.Client{Transport: tr}
//
// Each request draws on a lane, one per key (by default the URL's host). An
// attempt first waits for a token from the lane's token bucket, then for an
// in-flight slot; waiters are served by priority (see WithPriority), FIFO
// within a level. Within a level, tenants take turns (see WithTenant and
// WithTenantShare), so one caller's flood does not hold up the others.
//
// A paced lane hands the base transport at most rate x T + burst + 1
// requests in any window T, and, while requests wait, the full rate: a
// token is charged when it was due, up to one token's time before a late
// wake-up hands it out.
//
// A lane learns from the server. Only a refusal stops it: a 429, a 403
// with Retry-After or nothing remaining, a 502, 503, 504 or 529 with
// Retry-After, GitHub's secondary rate limit stated in a 403's body, a
// GraphQL throttle in a /graphql answer's body; it pauses for the
// Retry-After, else until the exhausted quota (requests or tokens) comes
// back. A Retry-After that outlasts the reset of the quota the refusal
// exhausted (go-chi/httprate names its whole window) pauses until that
// reset, and one of a second whose quota is full again within it (a
// GCRA's wait rounded up, as throttled and redis_rate send it) pauses for
// one request's share of it; should the server refuse the first attempt
// sent after such a pause, every later Retry-After of the lane holds in
// full. An overload (529, or 502/503/504 without Retry-After, or a stream
// whose first event says so) is no latency sample and cuts the in-flight
// limit. No other body is looked at. A 429 that no quota explains lowers
// its pace (or, on a lane with no rate that has nothing accepted to
// estimate one from, pauses it 250 ms, twice as long at each round
// refused, until an attempt is accepted), and from then
// on, unless the server's quotas state a burst, the lane also spaces each
// grant from when the request before it was written (an httptrace hook on
// the attempt), so that a request delayed on its way does not reach a
// strict server bunched with the next. Rate-limit
// headers pace it by the kind of limit they describe, read from how they
// move: a fixed window (its reset instant stays put; what remains is spread
// until it) or a bucket (its reset moves later; it is paced at its refill
// rate, spending what it holds beyond that, and "remaining 0" means no
// burst left, not "stop") or a sliding-window counter (its reset is the end
// of each fixed window, yet what remains does not refill when it comes; it
// is paced at its limit per window less half a request, what a counter
// that rounds its estimate takes, and less a whole one after a refusal at
// that pace). A fixed window spent in a few milliseconds is told apart
// from a bucket when the next window's first answer states its reset
// further than a bucket that refilled as fast would take to fill. A
// reset rounded to the
// second never slows a lane below its configured rate. A refusal at a
// reset stated to the second that has just passed (a truncated instant)
// pauses the lane in steps through the second after it and teaches no
// rate; a fixed window's end is measured from the refills, with a guard
// for the transit to the server, widened when an attempt sent after that
// end was answered by the window.
//
// Reading the headers never serves a lane worse than ignoring them: a
// header may slow a lane only as far as the server's behaviour confirms,
// and a reading that a refusal contradicts, or that acceptances outrun,
// is dropped. A refill rate counted from the quotas is dropped when a
// later quota shows the server refilled faster; a count measures only
// while the bucket is known not full, its size known only from what the
// quotas showed remaining, since a stated limit may be a rate; a limit is
// read as a burst only once a quota showed a request remaining after one
// was taken; the throttle rate a 429 teaches bounds every header rate; and
// the quotas may raise a first estimate, never lower it.
//
// Several limits behind one host are sub-limits of its lane: a response
// that names its limit (GitHub's X-RateLimit-Resource, Discord's
// X-RateLimit-Bucket) files its route under it, and a caller can name one
// (WithSublimit, WithSublimitKey), such as an LLM model. A request takes a
// token on its sub-limit, then on the lane; one exhausted sub-limit holds
// back only its own requests.
//
// Budgets beyond requests, such as tokens per minute, are named with
// WithBudget and drawn on with WithCost. Processes that share an API key
// can share its rate and in-flight cap through a Backend, and its token
// budgets through a Leaser (see WithBackend and package sluiceredis).
package sluice
