package sluice

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/stats"
)

const (
	// retryMinWait and retryMaxWait are the min and max passed to the
	// Backoff. The default backoff waits a random time up to
	// retryMinWait x 2^n (full jitter), at most retryMaxWait.
	retryMinWait = 250 * time.Millisecond
	retryMaxWait = 10 * time.Second

	// drainLimit bounds how much of a discarded response is read so that its
	// connection can be reused; a longer body is closed unread.
	drainLimit = 64 << 10

	// DefaultRetryRatio and DefaultRetryMin make the default retry budget:
	// over any RetryBudgetWindow, a lane retries at most 20% as many
	// attempts as it made first attempts, plus 10. The ratio stops a retry
	// storm from multiplying load on a failing upstream; the 10 lets a quiet
	// lane still retry.
	DefaultRetryRatio = 0.2
	DefaultRetryMin   = 10
	RetryBudgetWindow = 10 * time.Second
)

// WithRetryBudget sets the retry budget: over any RetryBudgetWindow, a
// lane's retries may number at most ratio x its first attempts, plus min.
// A retry the budget refuses is not made: the last response is returned.
// Defaults DefaultRetryRatio (0.2) and DefaultRetryMin (10).
func WithRetryBudget(ratio float64, min int) Option {
	return optionFunc(func(c *config) error {
		if !(ratio >= 0 && ratio <= 1) {
			return invalid("WithRetryBudget(%v, %d): ratio must be in [0, 1]", ratio, min)
		}
		if min < 0 {
			return invalid("WithRetryBudget(%v, %d): min must not be negative", ratio, min)
		}
		c.retryRatio, c.retryMin = ratio, min
		return nil
	})
}

// retryBudget counts first attempts and retries over RetryBudgetWindow.
// The lane's mutex guards it.
type retryBudget struct {
	firsts, retries stats.Window
	made, refused   uint64
}

func newRetryBudget() retryBudget {
	return retryBudget{firsts: stats.NewWindow(RetryBudgetWindow), retries: stats.NewWindow(RetryBudgetWindow)}
}

// allowRetry reports whether the lane's budget allows one more retry, and
// counts it if so.
func (l *lane) allowRetry() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := &l.budget
	limit := l.cfg.retryRatio*float64(b.firsts.Sum(now)) + float64(l.cfg.retryMin)
	if float64(b.retries.Sum(now)+1) > limit {
		b.refused++
		return false
	}
	b.retries.Add(now, 1)
	b.made++
	return true
}

// do sends req through l, retrying under the Transport's policy. It returns
// the last response (with a nil error) or the last error.
//
// Each retry takes a token again, at the same priority, and keeps the
// enqueue time of the first attempt so it does not lose its place. Only
// bodies that can be replayed (GetBody) are retried, and methods that are
// not idempotent only when the server said it did not process the request
// (429, 503).
func (t *Transport) do(l *lane, req *http.Request, p Priority) (*http.Response, error) {
	ctx := req.Context()
	enq := firstAttempt
	areq := req
	for n := 0; ; n++ {
		resp, first, err := t.attempt(l, areq, p, enq)
		enq = first
		if n >= t.cfg.retries || !t.retryable(ctx, req, resp, err) {
			return resp, err
		}
		wait := t.backoff(n, resp)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
			return resp, err // a retry could not finish in time
		}
		next, rerr := rewind(req)
		if rerr != nil || !l.allowRetry() {
			return resp, err
		}
		discard(resp)
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				closeBody(next)
				return nil, ctx.Err()
			}
		}
		areq = next
	}
}

// retryable reports whether an attempt that returned resp, err may be
// retried: sluice's safety rules, then the policy.
func (t *Transport) retryable(ctx context.Context, req *http.Request, resp *http.Response, err error) bool {
	if err != nil && (errors.Is(err, ErrRejected) || ctx.Err() != nil) {
		return false // not sent, or the caller gave up
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // the body cannot be sent again
	}
	if !idempotent(req) && (resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable)) {
		return false // the server may have acted on it
	}
	policy := t.cfg.checkRetry
	if policy == nil {
		// What DefaultRetryPolicy answers for a response that is neither
		// a 429 nor a server error, without the call: most responses.
		if err == nil && resp.StatusCode > 0 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			return false
		}
		policy = retryablehttp.DefaultRetryPolicy
	}
	retry, perr := policy(ctx, resp, err)
	return retry && perr == nil
}

// idempotent reports whether req may be sent twice with the effect of once:
// RFC 9110's idempotent methods, or a request carrying an idempotency key
// (as net/http itself decides when it replays a request).
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// backoff returns how long to wait before retry n+1.
func (t *Transport) backoff(n int, resp *http.Response) time.Duration {
	if t.cfg.backoff != nil {
		return max(0, t.cfg.backoff(retryMinWait, retryMaxWait, n, resp))
	}
	return defaultBackoff(n, resp, t.cfg.maxRetryAfter)
}

// defaultBackoff waits nothing after a 429, or a response that named a
// time: the lane's pace and cooldown already hold the retry back as long as
// the server asked, and waiting again would waste budget. Otherwise it waits
// a random time up to retryMinWait x 2^n, capped at retryMaxWait.
func defaultBackoff(n int, resp *http.Response, maxRA time.Duration) time.Duration {
	if resp != nil {
		if resp.StatusCode == http.StatusTooManyRequests {
			return 0
		}
		if _, ok := headers.RetryAfter(resp.Header, time.Now(), maxRA); ok {
			return 0
		}
	}
	d := retryMaxWait
	if n < 16 {
		d = min(retryMaxWait, retryMinWait<<n)
	}
	return rand.N(d) + 1
}

// rewind returns a copy of req for another attempt, with a fresh body from
// GetBody. The caller's request is not modified.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	next.Body = body
	return next, nil
}

// discard drains a response that will not be returned (up to drainLimit, so
// that its connection can be reused) and closes it, which releases its slot.
func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	io.CopyN(io.Discard, resp.Body, drainLimit)
	resp.Body.Close()
}
