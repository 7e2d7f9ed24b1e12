package upstream

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Request headers that say what a request costs in tokens, read by the
// LLM models. A real API counts the tokens of the prompt (and reserves
// max_tokens for the answer); these headers stand for that count so that a
// test chooses it. A missing header means 0; a value that is not a
// non-negative integer gets 400.
const (
	CostTokensHeader       = "X-Cost-Tokens"        // OpenAI: the request's tokens
	CostInputTokensHeader  = "X-Cost-Input-Tokens"  // Anthropic: input tokens
	CostOutputTokensHeader = "X-Cost-Output-Tokens" // Anthropic: output tokens
)

// OpenAIConfig configures an [OpenAI] server model.
type OpenAIConfig struct {
	// Requests per Per (RPM when Per is a minute); must be positive.
	Requests int
	// Tokens per Per (TPM); 0 means no token budget and no -tokens headers.
	Tokens int
	// Per is the period of both budgets; default one minute.
	Per time.Duration
}

// OpenAI models OpenAI's API limits: two token buckets, one of Requests
// and one of Tokens, each refilling its whole capacity in Per. A request
// takes one request and its [CostTokensHeader] tokens; it is served only if
// both buckets hold enough. Every response carries
//
//	x-ratelimit-limit-requests: <Requests>
//	x-ratelimit-remaining-requests: <whole requests left>
//	x-ratelimit-reset-requests: <time until the bucket is full again>
//
// and, when Tokens > 0, the same three with -tokens. Reset is written as
// OpenAI writes it, a Go-like duration rounded up to the millisecond
// ("1s", "6m0s", "20ms", "7.66s"), and means "until full", not "until the
// next request is allowed". A refusal is 429 with retry-after-ms
// (milliseconds until the request would be accepted, rounded up) and
// retry-after (the same in whole seconds, rounded up). A request whose
// token cost exceeds Tokens can never be served: 429 without retry-after,
// as OpenAI answers "Request too large". Refused requests consume nothing.
type OpenAI struct {
	cfg OpenAIConfig

	mu       sync.Mutex
	requests bucket
	tokens   bucket
}

// NewOpenAI returns an OpenAI model. It panics if cfg is invalid.
func NewOpenAI(cfg OpenAIConfig) *OpenAI {
	if cfg.Per == 0 {
		cfg.Per = time.Minute
	}
	if cfg.Requests <= 0 || cfg.Tokens < 0 || cfg.Per < 0 {
		panic(fmt.Sprintf("upstream: invalid OpenAIConfig %+v", cfg))
	}
	m := &OpenAI{cfg: cfg, requests: newBucket(int64(cfg.Requests), cfg.Per)}
	if cfg.Tokens > 0 {
		m.tokens = newBucket(int64(cfg.Tokens), cfg.Per)
	}
	return m
}

// Rate returns the published request rate in requests per second.
func (m *OpenAI) Rate() float64 { return float64(m.cfg.Requests) / m.cfg.Per.Seconds() }

// Admit implements [Limiter].
func (m *OpenAI) Admit(now time.Time, r *http.Request) Decision {
	cost, ok := tokenCost(r, CostTokensHeader)
	if !ok {
		return badCost(CostTokensHeader)
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	d := Decision{Header: http.Header{}}
	wait := m.requests.wait(now, 1)
	which := "requests"
	if m.cfg.Tokens > 0 {
		tw := m.tokens.wait(now, cost)
		if tw < 0 || tw > wait {
			wait, which = tw, "tokens"
		}
	}
	switch {
	case wait == 0:
		d.Accepted = true
		m.requests.take(now, 1)
		if m.cfg.Tokens > 0 {
			m.tokens.take(now, cost)
		}
	case wait < 0:
		d.Body = openAIBody("Request too large: "+itoa(cost)+" tokens, limit "+itoa(int64(m.cfg.Tokens))+" per "+m.cfg.Per.String()+".", "tokens")
	default:
		d.Body = openAIBody("Rate limit reached for "+which+". Please try again in "+openAIDuration(wait)+".", which)
		d.Header.Set("retry-after-ms", itoa(int64((wait+time.Millisecond-1)/time.Millisecond)))
		d.Header.Set("retry-after", ceilSecondsStr(wait))
	}

	h := d.Header
	h.Set("x-ratelimit-limit-requests", itoa(int64(m.cfg.Requests)))
	h.Set("x-ratelimit-remaining-requests", itoa(m.requests.remaining(now)))
	h.Set("x-ratelimit-reset-requests", openAIDuration(m.requests.untilFull(now)))
	if m.cfg.Tokens > 0 {
		h.Set("x-ratelimit-limit-tokens", itoa(int64(m.cfg.Tokens)))
		h.Set("x-ratelimit-remaining-tokens", itoa(m.tokens.remaining(now)))
		h.Set("x-ratelimit-reset-tokens", openAIDuration(m.tokens.untilFull(now)))
	}
	return d
}

// openAIBody is the JSON error body of a refusal; typ is the budget that
// ran out, "requests" or "tokens".
func openAIBody(message, typ string) string {
	return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"code":"rate_limit_exceeded"}}`, message, typ)
}

// openAIDuration writes d as OpenAI's reset headers do: a Go duration
// string, rounded up to the millisecond.
func openAIDuration(d time.Duration) string {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d.String()
}

// tokenCost reads a token-cost request header: 0 if absent, ok false if
// it is not a non-negative integer.
func tokenCost(r *http.Request, name string) (int64, bool) {
	v := strings.TrimSpace(r.Header.Get(name))
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0
}

// badCost refuses a request whose cost header is invalid.
func badCost(name string) Decision {
	return Decision{Status: http.StatusBadRequest, Body: "invalid " + name + " header"}
}
