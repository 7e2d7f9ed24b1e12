package sluice

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/trace"
)

// How a middleware states when to retry after a refusal.
type retryKind int

const (
	retryNone  retryKind = iota // no Retry-After
	retryDelay                  // Retry-After in seconds
	retryDate                   // Retry-After a date (time.RFC1123 in UTC)
)

// TestReplayMiddlewareTraces replays the header traces recorded from real
// middleware through the header parsers, on the trace's own clock: each
// response must parse to the family, limit and kind of reset the
// middleware sends, with a remaining count and a reset within the
// published allowance, and a refusal's Retry-After must read as the
// middleware means it.
func TestReplayMiddlewareTraces(t *testing.T) {
	wants := map[string]struct {
		source  string
		limit   int64 // what X-RateLimit-Limit states; not always the rate
		instant bool  // the reset is an instant (Unix time or date), not a delay
		retry   retryKind
	}{
		"throttled.txt":     {"x-ratelimit", 6, false, retryDelay}, // MaxBurst 5 + 1; reset = until full
		"httprate.txt":      {"x-ratelimit", 10, true, retryDelay},
		"go-limiter.txt":    {"x-ratelimit", 10, true, retryDate},
		"ulule-limiter.txt": {"x-ratelimit", 10, true, retryNone},
		"tollbooth.txt":     {"ietf-draft07", 10, false, retryNone}, // RateLimit-*; X-Rate-Limit-Limit is "10.00"
		"redis_rate.txt":    {"x-ratelimit", 10, true, retryDelay},
	}
	files, err := filepath.Glob(filepath.Join("testdata", "traces", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	for name := range wants {
		if !slices.Contains(names, name) {
			t.Errorf("no trace %s in testdata/traces", name)
		}
	}
	for _, f := range files {
		name := filepath.Base(f)
		want, ok := wants[name]
		if !ok {
			t.Errorf("trace %s has no expectations here", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			tr, err := trace.Read(f)
			if err != nil {
				t.Fatal(err)
			}
			var refused, servedAfterRefusal int
			for i, r := range tr.Records {
				now := tr.Start.Add(r.Received)
				at := fmt.Sprintf("record %d (%v, %d)", i, r.Received, r.Status)
				q, ok := headers.Parse(r.Header, now)
				if !ok {
					t.Errorf("%s: Parse found nothing in %v", at, r.Header)
					continue
				}
				if q.Source != want.source || q.Limit != want.limit || q.Instant != want.instant || !q.Coarse || q.Window != 0 {
					t.Errorf("%s: Parse = %+v; want source %s, limit %d, instant %v, coarse", at, q, want.source, want.limit, want.instant)
				}
				if q.Remaining < 0 || q.Remaining > q.Limit || r.Status == http.StatusTooManyRequests && q.Remaining != 0 {
					t.Errorf("%s: remaining %d of %d", at, q.Remaining, q.Limit)
				}
				if q.Reset < 0 || q.Reset > tr.Per+time.Second {
					t.Errorf("%s: reset %v, beyond a window of %v and the second it may be rounded by", at, q.Reset, tr.Per)
				}
				if i == 0 && (r.Status != http.StatusOK || q.Remaining < q.Limit-2) {
					t.Errorf("first response: status %d, remaining %d of %d", r.Status, q.Remaining, q.Limit)
				}
				d, ok := headers.RetryAfter(r.Header, now, time.Minute)
				switch {
				case r.Status == http.StatusOK:
					if refused > 0 {
						servedAfterRefusal++
					}
					if ok {
						t.Errorf("%s: RetryAfter = %v on a success", at, d)
					}
				case r.Status != http.StatusTooManyRequests:
					t.Errorf("%s: status neither 200 nor 429", at)
				default:
					refused++
					switch want.retry {
					case retryNone:
						if ok {
							t.Errorf("%s: RetryAfter = %v; the middleware sends none", at, d)
						}
					case retryDelay:
						if !ok || d > tr.Per+time.Second {
							t.Errorf("%s: RetryAfter = %v, %v; want a wait of at most a window and a second", at, d, ok)
						}
					case retryDate:
						// A date names a whole second, which the middleware
						// truncated its reset to: it reads as a wait until
						// the end of that second, and none after it.
						v := r.Header.Get("Retry-After")
						date, err := time.Parse(time.RFC1123, v)
						if err != nil || !strings.HasSuffix(v, " UTC") {
							t.Fatalf("%s: Retry-After %q is not time.RFC1123 in UTC: %v", at, v, err)
						}
						ahead := date.Add(time.Second).Sub(now)
						if ok != (ahead > 0) || ok && d != ahead {
							t.Errorf("%s: RetryAfter(%q) = %v, %v at %v; want %v", at, v, d, ok, now, ahead)
						}
						if qd := max(ahead, 0); q.Reset != qd {
							t.Errorf("%s: reset %v; the date %q is %v ahead", at, q.Reset, r.Header.Get("X-Ratelimit-Reset"), qd)
						}
					}
				}
			}
			if refused == 0 || servedAfterRefusal == 0 {
				t.Errorf("%d refusals, %d successes after the first: the trace must show both", refused, servedAfterRefusal)
			}
		})
	}
}
