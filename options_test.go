package sluice

import (
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		opt  Option
		want string // must appear in the error: the option and the bad value
	}{
		{WithRate(0, time.Second), "WithRate(0, 1s)"},
		{WithRate(-5, time.Second), "WithRate(-5, 1s)"},
		{WithRate(10, 0), "WithRate(10, 0s)"},
		{WithRate(10, -time.Second), "WithRate(10, -1s)"},
		{WithRate(math.MaxInt, time.Nanosecond), "out of range"},
		{WithBurst(0), "WithBurst(0)"},
		{WithHeadroom(0), "WithHeadroom(0)"},
		{WithHeadroom(1.5), "WithHeadroom(1.5)"},
		{WithHeadroom(math.NaN()), "WithHeadroom(NaN)"},
		{WithConcurrency(0, 4), "WithConcurrency(0, 4)"},
		{WithConcurrency(5, 4), "WithConcurrency(5, 4)"},
		{WithAging(-time.Second), "WithAging(-1s)"},
		{WithBudget("", 10, time.Minute), `WithBudget("", 10, 1m0s)`},
		{WithBudget("tokens", 0, time.Minute), `WithBudget("tokens", 0, 1m0s)`},
		{WithBudget("tokens", 10, 0), `WithBudget("tokens", 10, 0s)`},
		{WithLowShare(1), "WithLowShare(1)"},
		{WithLowShare(-1), "WithLowShare(-1)"},
		{WithMaxWait(Priority(7), time.Second), "WithMaxWait(Priority(7), 1s)"},
		{WithMaxWait(Batch, 0), "WithMaxWait(batch, 0s)"},
		{WithRetry(-1), "WithRetry(-1)"},
		{WithRetryPolicy(nil), "WithRetryPolicy(nil)"},
		{WithBackoff(nil), "WithBackoff(nil)"},
		{WithMaxRetryAfter(0), "WithMaxRetryAfter(0s)"},
		{WithKey(nil), "WithKey(nil)"},
		{WithRetryBudget(-0.1, 1), "WithRetryBudget(-0.1, 1)"},
		{WithRetryBudget(1.5, 1), "WithRetryBudget(1.5, 1)"},
		{WithRetryBudget(0.2, -1), "WithRetryBudget(0.2, -1)"},
		{WithLogger(nil), "WithLogger(nil)"},
		{WithBackend(nil), "WithBackend(nil)"},
		{WithTenantShare(Priority(-1), 0.5), "WithTenantShare(Priority(-1), 0.5)"},
		{WithTenantShare(Batch, 0), "WithTenantShare(batch, 0)"},
		{WithTenantShare(Batch, 1.5), "WithTenantShare(batch, 1.5)"},
		{WithTenantShare(Batch, math.NaN()), "WithTenantShare(batch, NaN)"},
		{WithTenantQueue(0), "WithTenantQueue(0)"},
		{WithMaxQueue(-1), "WithMaxQueue(-1)"},
		{WithSublimitRate("", 10, time.Second), `WithSublimitRate("", 10, 1s)`},
		{WithSublimitRate(strings.Repeat("m", 65), 10, time.Second), `WithSublimitRate("mmmm`},
		{WithSublimitRate("bad\xff", 10, time.Second), `WithSublimitRate("bad\xff", 10, 1s)`},
		{WithSublimitRate("gpt-4o", 0, time.Minute), `WithSublimitRate("gpt-4o", 0, 1m0s)`},
		{WithSublimitRate("gpt-4o", 10, 0), `WithSublimitRate("gpt-4o", 10, 0s)`},
		{WithSublimitRate("gpt-4o", math.MaxInt, time.Nanosecond), "out of range"},
		{nil, "option 0 is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			tr, err := New(nil, tt.opt)
			if err == nil {
				t.Fatalf("New accepted it: %+v", tr)
			}
			if !errors.Is(err, ErrInvalidOption) {
				t.Errorf("error %q does not match ErrInvalidOption", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "sluice: ") {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	tr := mustNew(t, nil, WithRate(500, time.Minute))
	if tr.base != nil || tr.baseRT() != http.DefaultTransport {
		t.Errorf("nil base: got %T, want http.DefaultTransport read at each request", tr.baseRT())
	}
	c := tr.cfg
	if c.burst != DefaultBurst || c.headroom != DefaultHeadroom || c.minConc != DefaultMinConcurrency ||
		c.maxConc != DefaultMaxConcurrency || c.retries != DefaultRetries || c.maxRetryAfter != DefaultMaxRetryAfter {
		t.Errorf("defaults not applied: %+v", c)
	}
	if got, want := c.perSecond(), 500.0/60; math.Abs(got-want) > 1e-9 {
		t.Errorf("perSecond = %v, want %v", got, want)
	}
	tr = mustNew(t, nil, WithRate(500, time.Minute), WithHeadroom(0.8))
	if got, want := tr.cfg.perSecond(), 500.0/60*0.8; math.Abs(got-want) > 1e-9 {
		t.Errorf("perSecond with headroom = %v, want %v", got, want)
	}
}

// TestBudgetOptionsTogether: budgets are checked as a set, and against a
// Backend, which cannot share them.
func TestBudgetOptionsTogether(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithBudget("tokens", 10, time.Minute), WithBudget("tokens", 20, time.Minute)}, `budget "tokens" is already set`},
		{[]Option{WithBudget("a", 1, time.Second), WithBudget("b", 1, time.Second), WithBudget("c", 1, time.Second),
			WithBudget("d", 1, time.Second), WithBudget("e", 1, time.Second), WithBudget("f", 1, time.Second),
			WithBudget("g", 1, time.Second), WithBudget("h", 1, time.Second), WithBudget("i", 1, time.Second)}, "more than 8 budgets"},
		{[]Option{WithBudget("tokens", 10, time.Minute), WithBackend(newMemBackend())}, "WithBudget(\"tokens\", ...) with WithBackend"},
	} {
		_, err := New(nil, c.opts...)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an invalid option naming %q", err, c.want)
		}
	}
}
