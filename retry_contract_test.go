package sluice

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// TestServerRetryHints: x-should-retry and Stripe-Should-Retry decide
// over sluice's own rules, both ways.
func TestServerRetryHints(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		idemKey  bool
		status   int
		hint     string // header: value
		attempts int32
	}{
		{"GET 503 x-should-retry false", "GET", false, 503, "X-Should-Retry: false", 1},
		{"GET 429 x-should-retry false", "GET", false, 429, "X-Should-Retry: false", 1},
		{"POST 500 x-should-retry true", "POST", false, 500, "X-Should-Retry: true", 3},
		{"POST 409 x-should-retry true", "POST", false, 409, "x-should-retry: TRUE", 3},
		{"POST+key 500 Stripe-Should-Retry false", "POST", true, 500, "Stripe-Should-Retry: false", 1},
		{"POST 409 Stripe-Should-Retry true", "POST", false, 409, "Stripe-Should-Retry: true", 3},
		{"GET 200 x-should-retry true is kept", "GET", false, 200, "X-Should-Retry: true", 1},
		{"POST without a hint: not retried", "POST", false, 500, "", 1},
		{"GET 503 without a hint: retried", "GET", false, 503, "", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &countBase{status: tt.status, hdr: http.Header{}}
				if k, v, ok := strings.Cut(tt.hint, ": "); ok {
					base.hdr.Set(k, v)
				}
				tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait))
				req, _ := http.NewRequest(tt.method, "http://api.test/v1", strings.NewReader("{}"))
				if tt.idemKey {
					req.Header.Set("Idempotency-Key", "k1")
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if n := base.n.Load(); n != tt.attempts {
					t.Errorf("%d attempts, want %d", n, tt.attempts)
				}
			})
		})
	}
}

// errBase fails every attempt with err and counts them.
type errBase struct {
	err error
	n   atomic.Int32
}

func (b *errBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.n.Add(1)
	return nil, b.err
}

// TestPermanentErrorsNotRetried: errors that a second attempt
// cannot fix are not retried, bare (as a base RoundTripper returns them) or
// wrapped in *url.Error, under the default policy and under one that retries
// every error.
func TestPermanentErrorsNotRetried(t *testing.T) {
	cert := &x509.Certificate{}
	errs := map[string]error{
		"unknown authority":        x509.UnknownAuthorityError{},
		"certificate invalid":      x509.CertificateInvalidError{Reason: x509.Expired},
		"hostname":                 x509.HostnameError{Certificate: cert, Host: "api.test"},
		"tls verification":         &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}},
		"wrapped tls verification": fmt.Errorf("tls: %w", &tls.CertificateVerificationError{Err: errors.New("x")}),
		"unsupported scheme":       errors.New(`unsupported protocol scheme "ftp"`),
		"invalid header name":      errors.New(`net/http: invalid header field name "a b"`),
		"invalid header value":     errors.New(`net/http: invalid header field value for "X"`),
		"too many redirects":       errors.New("stopped after 10 redirects"),
		"headers too large":        errors.New("net/http: server response headers exceeded 1048576 bytes; aborted"),
		"nil response":             errNilResponse,
	}
	always := func(context.Context, *http.Response, error) (bool, error) { return true, nil }
	for name, e := range errs {
		for _, wrapped := range []bool{false, true} {
			for _, policy := range []retryablehttp.CheckRetry{nil, always} {
				err := e
				if wrapped {
					err = &url.Error{Op: "Get", URL: "http://api.test/", Err: e}
				}
				t.Run(fmt.Sprintf("%s/wrapped=%v/custom=%v", name, wrapped, policy != nil), func(t *testing.T) {
					base := &errBase{err: err}
					opts := []Option{WithRetry(2), WithBackoff(noWait)}
					if policy != nil {
						opts = append(opts, WithRetryPolicy(policy))
					}
					tr := mustNew(t, base, opts...)
					if err := get(context.Background(), tr, ""); err == nil {
						t.Fatal("no error")
					}
					if n := base.n.Load(); n != 1 {
						t.Errorf("%d attempts, want 1", n)
					}
				})
			}
		}
	}
	// A transient error is still retried.
	base := &errBase{err: errors.New("connection reset by peer")}
	tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait))
	get(context.Background(), tr, "")
	if n := base.n.Load(); n != 3 {
		t.Errorf("transient error: %d attempts, want 3", n)
	}
}

// TestPermanentErrorsRealTransport: the errors a real
// http.Transport returns for an untrusted certificate and for response
// headers over its limit are attempted once.
func TestPermanentErrorsRealTransport(t *testing.T) {
	t.Run("certificate", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		var n atomic.Int32
		srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				n.Add(1)
			}
		}
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors are expected
		srv.StartTLS()
		defer srv.Close()
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait))
		req, _ := http.NewRequest("GET", srv.URL, nil)
		_, err := tr.RoundTrip(req)
		if err == nil {
			t.Fatal("no error from an untrusted certificate")
		}
		if got := n.Load(); got != 1 {
			t.Errorf("%d connections (attempts), want 1: %v", got, err)
		}
	})
	t.Run("headers too large", func(t *testing.T) {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("X-Big", strings.Repeat("a", 4<<10))
		}))
		defer srv.Close()
		base := &http.Transport{MaxResponseHeaderBytes: 1 << 10}
		defer base.CloseIdleConnections()
		tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait))
		req, _ := http.NewRequest("GET", srv.URL, nil)
		_, err := tr.RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), "server response headers exceeded") {
			t.Fatalf("err = %v", err)
		}
		if got := n.Load(); got != 1 {
			t.Errorf("%d attempts, want 1", got)
		}
	})
}

// TestCustomPolicyReadAsRetryablehttp: a CheckRetry's (retry, err) is
// read as go-retryablehttp's Client.Do reads it: retry when retry is true,
// whatever err is.
func TestCustomPolicyReadAsRetryablehttp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &countBase{status: http.StatusBadGateway}
		tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait), WithRetryPolicy(retryablehttp.ErrorPropagatedRetryPolicy))
		req, _ := http.NewRequest("GET", "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("err = %v; the last response comes with a nil error", err)
		}
		resp.Body.Close()
		if n := base.n.Load(); n != 3 {
			t.Errorf("%d attempts, want 3", n)
		}
	})
}

// getBodyTracker hands out bodies from GetBody and records them.
type getBodyTracker struct {
	mu     sync.Mutex
	bodies []*trackBody
}

func (g *getBodyTracker) attach(req *http.Request, payload string) {
	req.GetBody = func() (io.ReadCloser, error) {
		b := &trackBody{Reader: strings.NewReader(payload)}
		g.mu.Lock()
		g.bodies = append(g.bodies, b)
		g.mu.Unlock()
		return b, nil
	}
}

func (g *getBodyTracker) open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, b := range g.bodies {
		if !b.closed.Load() {
			n++
		}
	}
	return n
}

// TestGetBodyClosedOnEveryPath: every body taken from GetBody is
// closed, including when the retry budget refuses the retry.
func TestGetBodyClosedOnEveryPath(t *testing.T) {
	t.Run("budget refuses", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := mustNew(t, &countBase{status: 503}, WithRetry(2), WithBackoff(noWait), WithRetryBudget(0, 0))
			var g getBodyTracker
			req, _ := http.NewRequest("PUT", "http://api.test/", strings.NewReader("x"))
			g.attach(req, "x")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if n := g.open(); n != 0 {
				t.Errorf("%d bodies from GetBody left open (of %d taken)", n, len(g.bodies))
			}
		})
	})
	t.Run("cancelled during backoff", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &countBase{status: 503}
			ctx, cancel := context.WithCancel(t.Context())
			tr := mustNew(t, base, WithRetry(2), WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration {
				cancel()
				return time.Second
			}))
			var g getBodyTracker
			req, _ := http.NewRequestWithContext(ctx, "PUT", "http://api.test/", strings.NewReader("x"))
			g.attach(req, "x")
			if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v", err)
			}
			if n := g.open(); n != 0 {
				t.Errorf("%d bodies from GetBody left open", n)
			}
		})
	})
}

// TestResponseRequestIsCallers: after a retry, resp.Request is the
// caller's request, not sluice's copy.
func TestResponseRequestIsCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, 503)}
		tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait))
		req, _ := http.NewRequest("GET", "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.arrivals) != 2 {
			t.Fatalf("%d attempts, want 2", len(base.arrivals))
		}
		if resp.Request != req {
			t.Error("resp.Request is not the caller's request")
		}
	})
}

// TestLogsCarryContext: retries and refusals are logged with the
// request's context, at the documented levels.
func TestLogsCarryContext(t *testing.T) {
	type key struct{}
	synctest.Test(t, func(t *testing.T) {
		h := &logRecorder{}
		base := &fakeBase{answer: answerWith(1, 503)}
		tr := mustNew(t, base, WithRetry(2), WithBackoff(noWait), WithLogger(slog.New(h)),
			WithRate(1, time.Second), WithMaxWait(Batch, time.Millisecond))
		ctx := context.WithValue(t.Context(), key{}, "trace-1")
		if err := get(ctx, tr, ""); err != nil {
			t.Fatal(err)
		}
		if err := get(WithPriority(ctx, Batch), tr, ""); !errors.Is(err, ErrRejected) {
			t.Fatalf("err = %v, want a refusal", err)
		}
		for _, c := range []struct {
			msg   string
			level slog.Level
		}{{"sluice: retrying", slog.LevelInfo}, {"sluice: request refused", slog.LevelInfo}} {
			recs := h.find(c.msg)
			if len(recs) != 1 {
				t.Errorf("%q logged %d times, want once", c.msg, len(recs))
				continue
			}
			if recs[0].level != c.level {
				t.Errorf("%q at %v, want %v", c.msg, recs[0].level, c.level)
			}
			if recs[0].ctx == nil || recs[0].ctx.Value(key{}) != "trace-1" {
				t.Errorf("%q logged without the request's context", c.msg)
			}
		}
	})
}

// TestBudgetRefusalLogged: a retry the budget refuses is logged at
// Warn with the request's context.
func TestBudgetRefusalLogged(t *testing.T) {
	type key struct{}
	synctest.Test(t, func(t *testing.T) {
		h := &logRecorder{}
		tr := mustNew(t, &countBase{status: 503}, WithRetry(2), WithBackoff(noWait), WithRetryBudget(0, 0), WithLogger(slog.New(h)))
		ctx := context.WithValue(t.Context(), key{}, "trace-2")
		get(ctx, tr, "")
		recs := h.find("sluice: retry refused by the retry budget")
		if len(recs) != 1 || recs[0].level != slog.LevelWarn || recs[0].ctx.Value(key{}) != "trace-2" {
			t.Errorf("records %+v, want one at Warn with the request's context", recs)
		}
	})
}

// TestSDKRequestsNotRetried: a request from an SDK that retries on
// its own (its marker header) is attempted once by sluice: the SDK decides.
// A Google client's header without an attempt count is no such marker.
func TestSDKRequestsNotRetried(t *testing.T) {
	for _, c := range []struct {
		marker string
		want   int32
	}{
		{"X-Stainless-Retry-Count: 0", 1},
		{"X-Stainless-Retry-Count: 2", 1},
		{"X-Stripe-Client-User-Agent: {}", 1},
		{"Amz-Sdk-Request: attempt=1; max=3", 1},
		{"User-Agent: myapp azsdk-go-azblob/v1.8.3 (go1.26; linux)", 1},
		{"X-Goog-Api-Client: gccl-invocation-id/0b6e gccl-attempt-count/1 gl-go/1.26 gccl/1.71.0", 1},
		{"X-Goog-Api-Client: gl-go/1.26 gdcl/0.316.0", 1 + DefaultRetries},
	} {
		t.Run(c.marker, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &countBase{status: 429}
				tr := mustNew(t, base, WithBackoff(noWait))
				req, _ := http.NewRequest("POST", "http://api.test/", bytes.NewReader([]byte("{}")))
				k, v, _ := strings.Cut(c.marker, ": ")
				req.Header.Set(k, v)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if n := base.n.Load(); n != c.want {
					t.Errorf("%d attempts, want %d", n, c.want)
				}
			})
		})
	}
}
