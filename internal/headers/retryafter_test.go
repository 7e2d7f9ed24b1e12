package headers

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// now is the client's clock in the tests.
var now = time.Date(2024, time.January, 2, 15, 4, 5, 0, time.UTC)

// header builds an http.Header from name, value pairs, adding repeated
// names as separate lines.
func header(kv ...string) http.Header {
	h := make(http.Header)
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func httpDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

func TestRetryAfter(t *testing.T) {
	const max = time.Hour
	tests := []struct {
		name   string
		h      http.Header
		max    time.Duration
		want   time.Duration
		wantOK bool
	}{
		{"seconds", header("Retry-After", "120"), max, 120 * time.Second, true},
		{"decimal 2.0", header("Retry-After", "2.0"), max, 2 * time.Second, true},
		{"decimal 1.5", header("Retry-After", "1.5"), max, 1500 * time.Millisecond, true},
		{"surrounding OWS", header("Retry-After", " \t7 "), max, 7 * time.Second, true},
		{"leading zeros", header("Retry-After", "007"), max, 7 * time.Second, true},
		{"sub-nanosecond digits truncated", header("Retry-After", "1.0000000019"), max, time.Second + 1, true},
		{"IMF-fixdate against Date", header(
			"Date", "Tue, 02 Jan 2024 14:04:05 GMT", // server clock 1h behind
			"Retry-After", "Tue, 02 Jan 2024 14:05:35 GMT",
		), max, 91 * time.Second, true}, // to the end of the second named
		{"IMF-fixdate against now", header("Retry-After", httpDate(now.Add(45*time.Second))), max, 46 * time.Second, true},
		{"IMF-fixdate with garbage Date", header("Date", "yesterday", "Retry-After", httpDate(now.Add(45*time.Second))), max, 46 * time.Second, true},
		{"IMF-fixdate of the current second", header("Retry-After", httpDate(now)), max, time.Second, true},
		{"RFC 850 date", header(
			"Date", "Sunday, 06-Nov-94 08:48:37 GMT",
			"Retry-After", "Sunday, 06-Nov-94 08:49:37 GMT",
		), max, 61 * time.Second, true},
		{"asctime date", header(
			"Date", "Sun Nov  6 08:49:07 1994",
			"Retry-After", "Sun Nov  6 08:49:37 1994",
		), max, 31 * time.Second, true},
		{"retry-after-ms", header("retry-after-ms", "250"), max, 250 * time.Millisecond, true},
		{"retry-after-ms decimal", header("retry-after-ms", "12.5"), max, 12500 * time.Microsecond, true},
		{"x-ms-retry-after-ms", header("x-ms-retry-after-ms", "1000"), max, time.Second, true},
		{"retry-after-ms wins", header("Retry-After", "10", "x-ms-retry-after-ms", "300", "retry-after-ms", "250"), max, 250 * time.Millisecond, true},
		{"x-ms-retry-after-ms beats Retry-After", header("Retry-After", "10", "x-ms-retry-after-ms", "300"), max, 300 * time.Millisecond, true},
		{"bad retry-after-ms falls through", header("retry-after-ms", "soon", "Retry-After", "3"), max, 3 * time.Second, true},
		{"RFC 1123 date in UTC", header("Retry-After", now.Add(45*time.Second).Format(time.RFC1123)), max, 46 * time.Second, true},
		{"RFC 1123 date in UTC against Date", header(
			"Date", "Tue, 02 Jan 2024 14:04:05 GMT", // server clock 1h behind
			"Retry-After", "Tue, 02 Jan 2024 14:04:06 UTC",
		), max, 2 * time.Second, true},
		{"RFC 1123 date in UTC capped", header("Retry-After", now.Add(48*time.Hour).Format(time.RFC1123)), max, max, true},
		{"RFC 1123 date in UTC, past", header("Retry-After", now.Add(-time.Second).Format(time.RFC1123)), max, 0, false},
		{"RFC 1123 date in another zone", header("Retry-After", "Tue, 02 Jan 2024 15:05:05 PST"), max, 0, false},
		{"RFC 1123 date, lower-case utc", header("Retry-After", "Tue, 02 Jan 2024 15:05:05 utc"), max, 0, false},
		{"first line only", header("Retry-After", "5", "Retry-After", "500"), max, 5 * time.Second, true},
		{"capped to max", header("Retry-After", "999999999"), max, max, true},
		{"capped date", header("Retry-After", httpDate(now.Add(48*time.Hour))), max, max, true},
		{"no cap", header("Retry-After", "999999999"), 0, 999999999 * time.Second, true},
		{"negative max is no cap", header("Retry-After", "7200"), -1, 2 * time.Hour, true},

		{"absent", header(), max, 0, false},
		{"negative", header("Retry-After", "-1"), max, 0, false},
		{"plus sign", header("Retry-After", "+5"), max, 0, false},
		{"zero", header("Retry-After", "0"), max, 0, false},
		{"zero decimal", header("Retry-After", "0.0"), max, 0, false},
		{"NaN", header("Retry-After", "NaN"), max, 0, false},
		{"Inf", header("Retry-After", "Inf"), max, 0, false},
		{"exponent", header("Retry-After", "1e3"), max, 0, false},
		{"hex", header("Retry-After", "0x10"), max, 0, false},
		{"trailing dot", header("Retry-After", "1."), max, 0, false},
		{"leading dot", header("Retry-After", ".5"), max, 0, false},
		{"two dots", header("Retry-After", "1.2.3"), max, 0, false},
		{"comma", header("Retry-After", "1,5"), max, 0, false},
		{"inner space", header("Retry-After", "1 0"), max, 0, false},
		{"overflow", header("Retry-After", "99999999999999999999"), max, 0, false},
		{"overflows Duration: saturates, capped", header("Retry-After", "9999999999"), max, max, true},
		{"hostile 99999999999: capped", header("Retry-After", "99999999999"), max, max, true},
		{"ms overflow", header("retry-after-ms", "99999999999999999999"), max, 0, false},
		{"empty", header("Retry-After", ""), max, 0, false},
		{"garbage", header("Retry-After", "abc"), max, 0, false},
		{"date in 1999", header("Retry-After", "Fri, 31 Dec 1999 23:59:59 GMT"), max, 0, false},
		{"date equal to Date: its second to run", header("Date", httpDate(now), "Retry-After", httpDate(now)), max, time.Second, true},
		{"date a second before Date", header("Date", httpDate(now), "Retry-After", httpDate(now.Add(-time.Second))), max, 0, false},
		{"too long", header("Retry-After", strings.Repeat("1", maxFieldLen+1)), max, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryAfter(tt.h, now, tt.max)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("RetryAfter(%v) = %v, %v; want %v, %v", tt.h, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestHeaderNamesCanonical(t *testing.T) {
	for _, k := range []string{
		hdrRetryAfterMs, hdrMSRetryAfterMs, hdrRetryAfter, hdrDate,
		hdrRateLimitPolicy, hdrRateLimit, hdrRateLimitLimit, hdrRateLimitRemaining, hdrRateLimitReset,
		hdrXRateLimitLimit, hdrXRateLimitRemaining, hdrXRateLimitReset, hdrXRateLimitUsed, hdrXRateLimitResource,
		hdrTwitterLimit, hdrTwitterRemaining, hdrTwitterReset,
		hdrOpenAILimit, hdrOpenAIRemaining, hdrOpenAIReset,
		hdrAnthropicLimit, hdrAnthropicRemaining, hdrAnthropicReset,
	} {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("%q is not canonical; want %q", k, c)
		}
	}
}

// A date names a whole second: read later in that second, the wait is
// what is left of it; read after it, there is none.
func TestRetryAfterDateEndsWithItsSecond(t *testing.T) {
	h := header("Retry-After", now.Format(time.RFC1123))
	if d, ok := RetryAfter(h, now.Add(600*time.Millisecond), time.Minute); !ok || d != 400*time.Millisecond {
		t.Errorf("0.6 s into the second named: RetryAfter = %v, %v; want 400ms, true", d, ok)
	}
	if d, ok := RetryAfter(h, now.Add(time.Second), time.Minute); ok {
		t.Errorf("at the end of the second named: RetryAfter = %v, true; want none", d)
	}
	q, ok := Parse(header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", now.Format(time.RFC1123)), now.Add(600*time.Millisecond))
	if !ok || q.Reset != 400*time.Millisecond || !q.Instant || !q.Coarse {
		t.Errorf("0.6 s into the second named: Parse = %+v, %v; want a reset of 400ms, an instant, coarse", q, ok)
	}
}
