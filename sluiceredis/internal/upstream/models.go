package upstream

// Server models: each is a [Limiter] that enforces its limit itself and
// publishes it the way a real API or middleware does, for [Config.Limiter]:
//
//	NewGitHub         GitHub REST: fixed window, X-RateLimit-* with epoch reset;
//	                  403 at the primary limit; 403 + Retry-After during a
//	                  secondary-limit penalty
//	NewOpenAI         OpenAI: request and token buckets, x-ratelimit-*-requests
//	                  and -tokens, reset = time until full ("6m0s");
//	                  429 + retry-after-ms / retry-after
//	NewAnthropic      Anthropic: request, input- and output-token buckets,
//	                  anthropic-ratelimit-*, reset = RFC 3339 instant when full;
//	                  429 + retry-after
//	NewIETF           IETF RateLimit / RateLimit-Policy over a bucket;
//	                  429 + Retry-After
//	NewGCRA           throttled / redis_rate style GCRA: X-RateLimit-* with reset
//	                  = whole seconds until full (or no headers at all);
//	                  429 + Retry-After
//	NewSlidingWindow  go-chi/httprate sliding-window counter: X-RateLimit-*
//	                  with epoch reset; 429 + Retry-After
//
// Every model is safe for concurrent use and decides on the arrival instant
// the Server passes it, so it works in real time over [NewTCP] and on the
// virtual clock of a testing/synctest bubble over [New]. Create a model
// inside the bubble that uses it.

// Model is a [Limiter] that can say what rate it publishes.
type Model interface {
	Limiter
	// Rate is the published sustained rate, in requests per second.
	Rate() float64
}

var (
	_ Model = (*GitHub)(nil)
	_ Model = (*OpenAI)(nil)
	_ Model = (*Anthropic)(nil)
	_ Model = (*IETF)(nil)
	_ Model = (*GCRA)(nil)
	_ Model = (*SlidingWindow)(nil)
)
