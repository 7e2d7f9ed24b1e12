package upstream

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// IETFConfig configures an [IETF] server model.
type IETFConfig struct {
	// Quota requests per Window: the sustained rate. Both must be
	// positive; the policy header gives Window in whole seconds, rounded up.
	Quota  int
	Window time.Duration
	// Burst is the bucket's capacity, the requests accepted at once after
	// a pause; default 1.
	Burst int
	// Name of the policy in both headers; default "default".
	Name string
}

// IETF models a server that publishes the IETF httpapi draft's structured
// fields (draft-ietf-httpapi-ratelimit-headers, -08 and later, in the
// shape of draft-11) over a token bucket of Burst requests that refills
// Quota requests per Window. Every response carries
//
//	RateLimit-Policy: "default";q=<Quota>;w=<Window seconds>
//	RateLimit: "default";r=<whole requests left>;t=<seconds until more quota>
//
// where t is the time until the bucket holds one more whole request,
// rounded up to whole seconds (0 when the bucket is full): with a bucket,
// "until more quota" is what a reset can mean, and a 50/s server thus says
// t=1 on almost every response. A refusal is 429 with Retry-After (whole
// seconds until the request would be accepted, rounded up); refused
// requests consume nothing.
type IETF struct {
	cfg    IETFConfig
	policy string

	mu sync.Mutex
	b  bucket
}

// NewIETF returns an IETF model. It panics if cfg is invalid.
func NewIETF(cfg IETFConfig) *IETF {
	if cfg.Burst == 0 {
		cfg.Burst = 1
	}
	if cfg.Name == "" {
		cfg.Name = "default"
	}
	if cfg.Quota <= 0 || cfg.Window <= 0 || cfg.Burst < 0 {
		panic(fmt.Sprintf("upstream: invalid IETFConfig %+v", cfg))
	}
	fill := time.Duration(mulDiv(int64(cfg.Burst), int64(cfg.Window), int64(cfg.Quota), true))
	return &IETF{
		cfg:    cfg,
		policy: fmt.Sprintf("%q;q=%d;w=%d", cfg.Name, cfg.Quota, ceilSeconds(cfg.Window)),
		b:      newBucket(int64(cfg.Burst), fill),
	}
}

// Rate returns the published rate in requests per second.
func (m *IETF) Rate() float64 { return float64(m.cfg.Quota) / m.cfg.Window.Seconds() }

// Admit implements [Limiter].
func (m *IETF) Admit(now time.Time, _ *http.Request) Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.b.admit(now)
	d.Header.Set("RateLimit-Policy", m.policy)
	d.Header.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", m.cfg.Name, m.b.remaining(now), ceilSeconds(m.b.untilNext(now))))
	return d
}
