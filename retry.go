package sluice

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/verdict"
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
	// drainWait bounds how long a response that a retry replaces is read
	// (see keep).
	drainWait = time.Second

	// DefaultRetryRatio and DefaultRetryMin make the default retry budget:
	// over any RetryBudgetWindow, a lane retries at most 20% as many
	// attempts as it made first attempts, plus 10. The ratio stops a retry
	// storm from multiplying load on a failing upstream; the 10 lets a quiet
	// lane still retry.
	DefaultRetryRatio = 0.2
	DefaultRetryMin   = 10               // see DefaultRetryRatio
	RetryBudgetWindow = 10 * time.Second // the window a retry budget counts over
)

// retryBudget counts first attempts and retries over RetryBudgetWindow.
// The lane's mutex guards it.
type retryBudget struct {
	firsts        stats.Window
	retries       *stats.Window // nil before the first retry
	made, refused uint64
}

func newRetryBudget() retryBudget {
	return retryBudget{firsts: stats.NewWindow(RetryBudgetWindow)}
}

// allowRetry reports whether the lane's budget allows one more retry, and
// if so counts it against the budget, at the time it returns. The retry is
// counted among those made (see countRetry) only once it is sent.
func (l *lane) allowRetry() (time.Time, bool) {
	l.lock()
	defer l.unlock()
	now := l.clk.timeOf(l.clk.tick())
	b := &l.budget
	limit := l.cfg.retryRatio*float64(b.firsts.Sum(now)) + float64(l.cfg.retryMin)
	if b.retries == nil {
		w := stats.NewWindow(RetryBudgetWindow)
		b.retries = &w
	}
	if float64(b.retries.Sum(now)+1) > limit {
		b.refused++
		return time.Time{}, false
	}
	b.retries.Add(now, 1)
	return now, true
}

// unretry takes back from the budget what allowRetry counted at at (zero:
// nothing) for a retry that was not sent after all: its backoff met the
// end of its context or a closed Transport, or the lane refused it. l is
// the lane that counted it, whichever the retry went to.
func (l *lane) unretry(at time.Time) {
	if l == nil || at.IsZero() {
		return
	}
	l.lock()
	defer l.unlock()
	if b := &l.budget; b.retries != nil {
		b.retries.Add(at, ^uint64(0)) // in at's bucket, if the window still holds it
	}
}

// countRetry counts a retry sent through the lane (see Stats.Retries).
func (l *lane) countRetry() {
	l.lock()
	l.budget.made++
	l.unlock()
}

// do sends req, at priority p for tenant id (see labels), through l,
// retrying under the Transport's policy. It returns
// the last response (with a nil error) or the last error. A response's
// Request is the caller's req, whichever attempt it answered.
//
// Each retry takes a token again, at the same priority, and keeps the
// enqueue time of the first attempt so it does not lose its place. See
// retryable for what is retried. A request from an SDK that retries on its
// own (see sdkRetries) is attempted once: the SDK decides.
func (t *Transport) do(l *lane, req *http.Request, p Priority, id string) (*http.Response, error) {
	resp, first, unread, err := t.attempt(l, req, p, id, firstAttempt, 1)
	if err == nil && t.final(resp, nil) {
		return resp, nil // most requests: one attempt, nothing to retry
	}
	return t.retry(l, req, p, id, resp, first, unread, err)
}

// retry is do once the first attempt, made with enqueue time firstAttempt,
// returned resp, first, unread and err (see attempt).
func (t *Transport) retry(l *lane, req *http.Request, p Priority, id string, resp *http.Response, first time.Duration, unread bool, err error) (*http.Response, error) {
	ctx := req.Context()
	enq := firstAttempt // the enqueue time the last attempt was made with
	areq := req
	var kept *http.Response // the last answer, read, while a retry of it is on its way
	var counted time.Time   // when the retry budget counted the retry on its way
	var countedOn *lane     // the lane whose budget counted it
	for n := 0; ; n++ {
		for err == errLaneGone {
			if enq == firstAttempt {
				l = t.relane(l)
			} else {
				// The first attempt came no later than the new lane did.
				l, enq = t.relaneAt(l, enq)
				enq = max(enq, 0)
			}
			resp, first, unread, err = t.attempt(l, areq, p, id, enq, n+1)
		}
		if countedOn != nil && (errors.Is(err, ErrRejected) || errors.Is(err, ErrClosed)) {
			// The retry was not sent: the budget takes it back, and the
			// answer that caused it stands, if it was kept.
			countedOn.unretry(counted)
			if kept != nil {
				return kept, nil
			}
		}
		enq = first
		if resp != nil && areq != req {
			resp.Request = req
		}
		if n >= t.cfg.retries || !t.retryable(ctx, req, resp, err) || sdkRetries(req) {
			return resp, err
		}
		wait := t.backoff(n, resp, unread)
		// The retry waits in the lane as well (a cooldown the answer began,
		// the pace): it is made only if it can be served within the
		// request's deadline and its level's WithMaxWait.
		est := max(wait, l.waitEstimate(p, id, first))
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= est {
			return resp, err
		}
		if mw := t.cfg.maxWait[p]; mw > 0 && est > mw {
			return resp, err
		}
		next := t.prepare(ctx, l, req, resp, err, n, wait, p, id)
		if next == nil {
			return resp, err
		}
		counted, countedOn = next.at, l
		kept = keep(resp)
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				closeBody(next.req)
				countedOn.unretry(counted)
				return nil, ctx.Err()
			case <-t.done:
				// Closed: the retry would fail with ErrClosed; the
				// answer that caused it stands.
				timer.Stop()
				closeBody(next.req)
				countedOn.unretry(counted)
				if kept != nil {
					return kept, nil
				}
				return nil, ErrClosed
			}
		}
		areq = next.req
		resp, first, unread, err = t.attempt(l, areq, p, id, enq, n+2)
	}
}

// A retrying is a retry on its way: its request, and when the retry
// budget counted it.
type retrying struct {
	req *http.Request
	at  time.Time
}

// prepare readies retry n+2 of req, after the answer resp, err of the
// attempt before and a backoff of wait: the request to send again, counted
// by l's retry budget, logged and reported. It returns nil if the retry is
// not to be made: the request's body cannot be had again, or the budget
// refuses it. The caller's code it runs (GetBody, the logger's handler)
// may panic: resp's body and the new request's are then closed, so that
// the answer's slot goes back at once, and the panic goes on.
func (t *Transport) prepare(ctx context.Context, l *lane, req *http.Request, resp *http.Response, err error, n int, wait time.Duration, p Priority, id string) (r *retrying) {
	var next *http.Request
	done := false
	defer func() {
		if !done {
			if resp != nil && resp.Body != nil {
				resp.Body.Close()
			}
			if next != nil {
				closeBody(next)
			}
		}
	}()
	next, rerr := rewind(req)
	if rerr != nil {
		done = true
		return nil
	}
	at, ok := l.allowRetry()
	if !ok {
		closeBody(next)
		if lg := t.cfg.logger; lg.Enabled(ctx, slog.LevelWarn) {
			lg.WarnContext(ctx, "sluice: retry refused by the retry budget", retryAttrs(l, n, resp, err, wait)...)
		}
		done = true
		return nil
	}
	if lg := t.cfg.logger; lg.Enabled(ctx, slog.LevelInfo) {
		lg.InfoContext(ctx, "sluice: retrying", retryAttrs(l, n, resp, err, wait)...)
	}
	if ev := t.cfg.events; ev != nil {
		e := Event{Kind: EventRetried, Lane: l.key, Priority: p, Tenant: id, Attempt: n + 2, Err: err, Wait: wait}
		if resp != nil {
			e.Status = resp.StatusCode
		}
		ev.push(ctx, &e)
	}
	done = true
	return &retrying{req: next, at: at}
}

// retryAttrs describes retry n+1 of a request for a log record.
func retryAttrs(l *lane, n int, resp *http.Response, err error, wait time.Duration) []any {
	a := []any{"lane", l.name(), "attempt", n + 2, "wait", wait}
	if resp != nil {
		a = append(a, "status", resp.StatusCode)
	}
	if err != nil {
		a = append(a, "err", err)
	}
	return a
}

// sdkRetryHeaders name headers that SDKs which retry on their own send with
// every attempt: X-Stainless-Retry-Count (openai-go, anthropic-sdk-go and
// the other Stainless SDKs), X-Stripe-Client-User-Agent (stripe-go) and
// Amz-Sdk-Request (aws-sdk-go-v2, "attempt=1; max=3").
var sdkRetryHeaders = [...]string{"X-Stainless-Retry-Count", "X-Stripe-Client-User-Agent", "Amz-Sdk-Request"}

// sdkUserAgent is in the User-Agent of the Azure SDK for Go's requests
// (azcore's, "azsdk-go-azblob/v1.8.3 (go1.26; linux)", after an
// application id if one is set): it retries on its own, and marks its
// attempts with no header of their own.
const sdkUserAgent = "azsdk-go-"

// sdkAttemptCount is in the X-Goog-Api-Client header of the requests of
// Google's Go clients that retry on their own (Cloud Storage's, and the
// generated API clients when they retry): "gccl-invocation-id/<uuid>
// gccl-attempt-count/2 gl-go/1.26 gccl/1.71.0". Those that do not retry
// send the header without it.
const sdkAttemptCount = "gccl-attempt-count/"

// sdkRetries reports whether req comes from an SDK that retries on its own,
// so that sluice's retries would multiply its attempts.
func sdkRetries(req *http.Request) bool {
	for _, k := range sdkRetryHeaders {
		if _, ok := req.Header[k]; ok {
			return true
		}
	}
	return strings.Contains(req.Header.Get("User-Agent"), sdkUserAgent) ||
		strings.Contains(req.Header.Get("X-Goog-Api-Client"), sdkAttemptCount)
}

// retryable reports whether an attempt that returned resp, err may be
// retried. In order:
//
//   - never a refusal, a closed Transport, an attempt whose context ended,
//     or an error that a second attempt cannot fix (see permanent);
//   - never a body that cannot be replayed (no GetBody);
//   - on an error status, the server's own hint decides when it gives one
//     (X-Should-Retry, as OpenAI and Anthropic send, or Stripe-Should-Retry):
//     false forbids the retry even of a 429 or 503, true allows it even for
//     a method that is not idempotent;
//   - a method that is not idempotent only on 429 and 503, when the server
//     did not act on the request;
//   - then the policy (WithRetryPolicy), read as go-retryablehttp's
//     Client.Do reads it: retry when it says true, whatever its error.
func (t *Transport) retryable(ctx context.Context, req *http.Request, resp *http.Response, err error) bool {
	return !t.final(resp, err) && t.mayRetry(ctx, req, resp, err)
}

// final reports whether nothing retryable lists would retry resp, err: a
// success with no policy to ask, as most responses are. Apart, so that it
// is inlined where do checks the first attempt.
func (t *Transport) final(resp *http.Response, err error) bool {
	return err == nil && uint(resp.StatusCode-1) < 399 && t.cfg.checkRetry == nil
}

// mayRetry is retryable past final.
func (t *Transport) mayRetry(ctx context.Context, req *http.Request, resp *http.Response, err error) bool {
	if err != nil && (errors.Is(err, ErrRejected) || errors.Is(err, ErrClosed) || ctx.Err() != nil || permanent(err)) {
		return false // not sent, the caller gave up, or it would fail again
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // the body cannot be sent again
	}
	if resp != nil && resp.StatusCode >= 400 {
		if retry, ok := serverHint(resp.Header); ok {
			return retry
		}
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
	return guarded(resp, func() bool {
		retry, _ := policy(ctx, resp, err)
		return retry
	})
}

// guarded returns f(), which runs the caller's code (a retry policy, a
// backoff) on resp. If f panics, resp's body is closed, so that the
// attempt's slot goes back at once, and the panic goes on.
func guarded[T any](resp *http.Response, f func() T) T {
	done := false
	defer func() {
		if !done && resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
	}()
	v := f()
	done = true
	return v
}

// serverHint returns what the server said about retrying its response:
// X-Should-Retry or Stripe-Should-Retry, "true" or "false" in any case.
func serverHint(h http.Header) (retry, ok bool) {
	for _, k := range [...]string{"X-Should-Retry", "Stripe-Should-Retry"} {
		v, found := h[k]
		if !found || len(v) == 0 {
			continue
		}
		switch s := strings.TrimSpace(v[0]); {
		case strings.EqualFold(s, "true"):
			return true, true
		case strings.EqualFold(s, "false"):
			return false, true
		}
	}
	return false, false
}

// permanentMessages are fragments of the messages of errors that a second
// attempt meets again: net/http's for a request it cannot send or a
// response it refuses to read, an http.Client's redirect limit (a base
// may be a client), and macOS's untrusted certificate. They are matched
// whether or not the error is wrapped, in a *url.Error or otherwise.
var permanentMessages = [...]string{
	"unsupported protocol scheme",
	"invalid header field",
	"server response headers exceeded",
	"no Host in request URL",
	"net/http: invalid method",
	"can't write control character",
	"certificate is not trusted",
}

// permanent reports whether err is an error that another attempt of the same
// request would meet again: a certificate the client does not accept, a
// request net/http cannot send, a response header over the base's limit, a
// redirect loop, or a base that answered nothing.
func permanent(err error) bool {
	if errors.Is(err, errNilResponse) {
		return true
	}
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		verify   *tls.CertificateVerificationError
	)
	if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verify) {
		return true
	}
	msg := err.Error()
	for _, m := range permanentMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	// http.Client's "stopped after 10 redirects".
	if strings.Contains(msg, "stopped after ") && strings.HasSuffix(msg, " redirects") {
		return true
	}
	return false
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

// backoff returns how long to wait before retry n+1, at most
// WithMaxRetryAfter.
func (t *Transport) backoff(n int, resp *http.Response, unread bool) time.Duration {
	if t.cfg.backoff != nil {
		d := guarded(resp, func() time.Duration { return t.cfg.backoff(retryMinWait, retryMaxWait, n, resp) })
		return min(max(0, d), t.cfg.maxRetryAfter)
	}
	return defaultBackoff(n, resp, t.cfg.maxRetryAfter, unread)
}

// defaultBackoff waits nothing after a response that named a time the lane
// pauses for (see verdict.Kind.Refused): the lane's cooldown holds the
// retry back as long as the server asked, in its place in the queue. Any
// other response that named a time, or a refusal no lane read (unread, see
// attempt), is waited for here. Otherwise it waits a random time up to
// retryMinWait x 2^n, capped at retryMaxWait.
func defaultBackoff(n int, resp *http.Response, maxRA time.Duration, unread bool) time.Duration {
	if resp != nil {
		if ra, ok := headers.RetryAfter(resp.Header, time.Now(), maxRA); ok {
			if !unread && verdict.Classify(resp.StatusCode, true, false, verdict.Signal{}).Refused() {
				return 0
			}
			return ra
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

// keep reads a response that a retry replaces (up to drainLimit, so that
// its connection can be reused) and closes it, which releases its slot.
// It returns a copy that holds the body read, to stand if the retry is not
// sent, or nil if resp is nil or its body was longer, failed or took
// longer than drainWait: such an answer does not stand.
func keep(resp *http.Response) *http.Response {
	if resp == nil {
		return nil
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		c := *resp
		c.Body = http.NoBody
		return &c
	}
	type drained struct {
		b   []byte
		err error
	}
	read := make(chan drained, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(resp.Body, drainLimit+1))
		read <- drained{b, err}
	}()
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
	var d drained
	select {
	case d = <-read:
	case <-timer.C:
		// A server that trickles the body holds neither the retry nor
		// the slot: Close cuts the read short.
		resp.Body.Close()
		return nil
	}
	resp.Body.Close()
	b, err := d.b, d.err
	if err != nil || len(b) > drainLimit {
		return nil
	}
	c := *resp
	c.Body = io.NopCloser(bytes.NewReader(b))
	return &c
}
