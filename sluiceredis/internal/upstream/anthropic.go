package upstream

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// AnthropicConfig configures an [Anthropic] server model.
type AnthropicConfig struct {
	// Requests per Per (RPM when Per is a minute); must be positive.
	Requests int
	// InputTokens and OutputTokens per Per (ITPM, OTPM); 0 means no such
	// budget. With neither, no token headers are sent.
	InputTokens  int
	OutputTokens int
	// Per is the period of every budget; default one minute.
	Per time.Duration
}

// Anthropic models Anthropic's API limits: token buckets of Requests,
// InputTokens and OutputTokens, each refilling its whole capacity in Per
// ("continuously replenished up to your maximum limit, rather than being
// reset at fixed intervals"). A request takes one request,
// [CostInputTokensHeader] input tokens and [CostOutputTokensHeader] output
// tokens, and is served only if every bucket holds enough. Every response
// carries
//
//	anthropic-ratelimit-requests-limit: <Requests>
//	anthropic-ratelimit-requests-remaining: <whole requests left>
//	anthropic-ratelimit-requests-reset: <RFC 3339 instant the bucket is full>
//
// and the same three for -input-tokens and -output-tokens when that budget
// is set, and for -tokens: the most restrictive token budget in effect
// (the one with the smallest fraction left), as Anthropic documents.
// Reset instants are UTC with whole seconds, rounded up (Anthropic sends
// "2024-04-08T21:26:02Z"). Real Anthropic rounds token counts to the
// nearest thousand; this model does not. A refusal is 429 with retry-after
// (whole seconds until the request would be accepted, rounded up). A
// request larger than a budget can never be served: 429 without
// retry-after. Refused requests consume nothing.
type Anthropic struct {
	cfg AnthropicConfig

	mu       sync.Mutex
	requests bucket
	input    bucket
	output   bucket
}

// NewAnthropic returns an Anthropic model. It panics if cfg is invalid.
func NewAnthropic(cfg AnthropicConfig) *Anthropic {
	if cfg.Per == 0 {
		cfg.Per = time.Minute
	}
	if cfg.Requests <= 0 || cfg.InputTokens < 0 || cfg.OutputTokens < 0 || cfg.Per < 0 {
		panic(fmt.Sprintf("upstream: invalid AnthropicConfig %+v", cfg))
	}
	return &Anthropic{
		cfg:      cfg,
		requests: newBucket(int64(cfg.Requests), cfg.Per),
		input:    newBucket(int64(max(cfg.InputTokens, 1)), cfg.Per),
		output:   newBucket(int64(max(cfg.OutputTokens, 1)), cfg.Per),
	}
}

// Rate returns the published request rate in requests per second.
func (m *Anthropic) Rate() float64 { return float64(m.cfg.Requests) / m.cfg.Per.Seconds() }

// Admit implements [Limiter].
func (m *Anthropic) Admit(now time.Time, r *http.Request) Decision {
	in, ok := tokenCost(r, CostInputTokensHeader)
	if !ok {
		return badCost(CostInputTokensHeader)
	}
	out, ok := tokenCost(r, CostOutputTokensHeader)
	if !ok {
		return badCost(CostOutputTokensHeader)
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	type budget struct {
		name  string
		limit int
		b     *bucket
		cost  int64
	}
	budgets := []budget{{"requests", m.cfg.Requests, &m.requests, 1}}
	if m.cfg.InputTokens > 0 {
		budgets = append(budgets, budget{"input-tokens", m.cfg.InputTokens, &m.input, in})
	}
	if m.cfg.OutputTokens > 0 {
		budgets = append(budgets, budget{"output-tokens", m.cfg.OutputTokens, &m.output, out})
	}

	var wait time.Duration
	which := ""
	for _, b := range budgets {
		if w := b.b.wait(now, b.cost); w < 0 || (wait >= 0 && w > wait) {
			wait, which = w, b.name
		}
	}

	d := Decision{Header: http.Header{}}
	switch {
	case wait == 0:
		d.Accepted = true
		for _, b := range budgets {
			b.b.take(now, b.cost)
		}
	case wait < 0:
		d.Body = anthropicBody("Request too large for the " + which + " rate limit.")
	default:
		d.Body = anthropicBody("This request would exceed your organization's rate limit of " + which + ".")
		d.Header.Set("retry-after", ceilSecondsStr(wait))
	}

	h := d.Header
	var tightest *budget
	for i := range budgets {
		b := &budgets[i]
		rem := b.b.remaining(now)
		p := "anthropic-ratelimit-" + b.name
		h.Set(p+"-limit", itoa(int64(b.limit)))
		h.Set(p+"-remaining", itoa(rem))
		h.Set(p+"-reset", ceilTime(now.Add(b.b.untilFull(now))).UTC().Format(time.RFC3339))
		// The tightest token budget has the smallest rem/limit.
		if b.name != "requests" && (tightest == nil ||
			rem*int64(tightest.limit) < tightest.b.remaining(now)*int64(b.limit)) {
			tightest = b
		}
	}
	if tightest != nil {
		p := "anthropic-ratelimit-" + tightest.name
		h.Set("anthropic-ratelimit-tokens-limit", h.Get(p+"-limit"))
		h.Set("anthropic-ratelimit-tokens-remaining", h.Get(p+"-remaining"))
		h.Set("anthropic-ratelimit-tokens-reset", h.Get(p+"-reset"))
	}
	return d
}

func anthropicBody(message string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":"rate_limit_error","message":%q}}`, message)
}
