package headers

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func TestParse(t *testing.T) {
	serverNow := now.Add(-time.Hour) // a server clock 1h behind the client
	tests := []struct {
		name   string
		h      http.Header
		want   Quota
		wantOK bool
	}{
		// GitHub.
		{"github 403 exhausted", header(
			"Date", httpDate(now),
			"X-RateLimit-Limit", "5000",
			"X-RateLimit-Remaining", "0",
			"X-RateLimit-Used", "5000",
			"X-RateLimit-Reset", unix(now.Add(30*time.Minute)),
			"X-RateLimit-Resource", "core",
		), Quota{5000, 0, 30 * time.Minute, 0, "github", "core", true, true, 0}, true},
		{"github remaining from used", header(
			"x-ratelimit-limit", "60",
			"x-ratelimit-used", "10",
			"x-ratelimit-reset", unix(now.Add(time.Minute)),
			"x-ratelimit-resource", "search",
		), Quota{60, 50, time.Minute, 0, "github", "search", true, true, 0}, true},
		{"github used above limit", header(
			"x-ratelimit-limit", "60",
			"x-ratelimit-used", "61",
			"x-ratelimit-resource", "core",
		), Quota{60, -1, 0, 0, "github", "core", false, false, 0}, true},

		// X-RateLimit and X-Rate-Limit.
		{"x-ratelimit delay reset", header(
			"X-RateLimit-Limit", "100",
			"X-RateLimit-Remaining", "42",
			"X-RateLimit-Reset", "30",
		), Quota{100, 42, 30 * time.Second, 0, "x-ratelimit", "", true, false, 0}, true},
		{"x-ratelimit fractional delay", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "0.25"),
			Quota{-1, 1, 250 * time.Millisecond, 0, "x-ratelimit", "", false, false, 0}, true},
		{"x-ratelimit epoch reset", header(
			"X-RateLimit-Remaining", "7",
			"X-RateLimit-Reset", unix(now.Add(90*time.Second)),
		), Quota{-1, 7, 90 * time.Second, 0, "x-ratelimit", "", true, true, 0}, true},
		{"x-ratelimit fractional epoch", header(
			"Date", httpDate(time.Unix(1700000000, 0)),
			"X-RateLimit-Remaining", "7",
			"X-RateLimit-Reset", "1700000000.5",
		), Quota{-1, 7, 500 * time.Millisecond, 0, "x-ratelimit", "", false, true, 0}, true},
		{"x-ratelimit RFC 1123 date in UTC", header(
			"X-RateLimit-Limit", "50",
			"X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", now.Add(time.Second).Format(time.RFC1123),
		), Quota{50, 0, 2 * time.Second, 0, "x-ratelimit", "", true, true, 0}, true},
		{"x-ratelimit RFC 1123 date against Date", header(
			"Date", httpDate(serverNow),
			"X-RateLimit-Remaining", "3",
			"X-RateLimit-Reset", serverNow.Add(2*time.Second).Format(time.RFC1123),
		), Quota{-1, 3, 3 * time.Second, 0, "x-ratelimit", "", true, true, 0}, true},
		{"x-ratelimit IMF-fixdate", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", httpDate(now.Add(time.Minute))),
			Quota{-1, 3, 61 * time.Second, 0, "x-ratelimit", "", true, true, 0}, true},
		{"x-ratelimit date of the current second", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", now.Format(time.RFC1123)),
			Quota{-1, 0, time.Second, 0, "x-ratelimit", "", true, true, 0}, true},
		{"x-ratelimit date in the past", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", now.Add(-2*time.Second).Format(time.RFC1123)),
			Quota{-1, 3, 0, 0, "x-ratelimit", "", true, true, time.Second}, true},
		{"x-ratelimit date beyond maxDuration", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", now.Add(maxDuration+time.Second).Format(time.RFC1123)),
			Quota{-1, 3, 0, 0, "x-ratelimit", "", false, false, 0}, true},
		{"x-ratelimit epoch beyond maxDuration", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", unix(now.Add(maxDuration+time.Second))),
			Quota{-1, 3, 0, 0, "x-ratelimit", "", false, false, 0}, true},
		{"x-ratelimit date in another zone", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", "Tue, 02 Jan 2024 15:05:05 CET"),
			Quota{-1, 3, 0, 0, "x-ratelimit", "", false, false, 0}, true},
		{"x-ratelimit epoch in the past", header(
			"X-RateLimit-Remaining", "7",
			"X-RateLimit-Reset", unix(now.Add(-time.Minute)),
		), Quota{-1, 7, 0, 0, "x-ratelimit", "", true, true, time.Minute}, true},
		{"x-ratelimit just below the epoch threshold is a delay", header(
			"X-RateLimit-Remaining", "7",
			"X-RateLimit-Reset", "999999999",
		), Quota{-1, 7, 0, 0, "x-ratelimit", "", false, false, 0}, true}, // a delay beyond 366 days: Reset ignored
		{"Date skew cancels", header(
			"Date", httpDate(serverNow),
			"X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", unix(serverNow.Add(30*time.Second)),
		), Quota{-1, 0, 30 * time.Second, 0, "x-ratelimit", "", true, true, 0}, true},
		{"skewed epoch without Date is already past", header(
			"X-RateLimit-Remaining", "3",
			"X-RateLimit-Reset", unix(serverNow.Add(30*time.Second)),
		), Quota{-1, 3, 0, 0, "x-ratelimit", "", true, true, 59*time.Minute + 30*time.Second}, true},
		{"twitter spelling", header(
			"x-rate-limit-limit", "900",
			"x-rate-limit-remaining", "899",
			"x-rate-limit-reset", unix(now.Add(15*time.Minute)),
		), Quota{900, 899, 15 * time.Minute, 0, "x-ratelimit", "", true, true, 0}, true},
		{"out-of-range field ignored, others kept", header(
			"X-RateLimit-Limit", "10000000000000",
			"X-RateLimit-Remaining", "5",
			"X-RateLimit-Reset", "-3",
		), Quota{-1, 5, 0, 0, "x-ratelimit", "", false, false, 0}, true},
		{"count at maxCount", header("X-RateLimit-Limit", "1000000000000"),
			Quota{1e12, -1, 0, 0, "x-ratelimit", "", false, false, 0}, true},
		{"reset at maxDuration", header("X-RateLimit-Reset", "31622400"),
			Quota{-1, -1, maxDuration, 0, "x-ratelimit", "", true, false, 0}, true},
		{"reset just above maxDuration", header("X-RateLimit-Reset", "31622400.5"), Quota{}, false},
		{"epoch far in the future", header("X-RateLimit-Reset", "999999999999999999"), Quota{}, false},
		{"all fields garbage", header(
			"X-RateLimit-Limit", "ten",
			"X-RateLimit-Remaining", "+5",
			"X-RateLimit-Reset", "1e9",
			"X-RateLimit-Resource", "core",
		), Quota{}, false},

		// OpenAI.
		{"openai", header(
			"x-ratelimit-limit-requests", "10000",
			"x-ratelimit-remaining-requests", "9999",
			"x-ratelimit-reset-requests", "6m0s",
			"x-ratelimit-limit-tokens", "2000000",
			"x-ratelimit-remaining-tokens", "1",
			"x-ratelimit-reset-tokens", "1ms",
		), Quota{10000, 9999, 6 * time.Minute, 0, "openai", "", true, false, 0}, true},
		{"openai compound duration", header("x-ratelimit-remaining-requests", "3", "x-ratelimit-reset-requests", "1h2m3.5s"),
			Quota{-1, 3, time.Hour + 2*time.Minute + 3500*time.Millisecond, 0, "openai", "", false, false, 0}, true},
		{"openai ms", header("x-ratelimit-remaining-requests", "3", "x-ratelimit-reset-requests", "20ms"),
			Quota{-1, 3, 20 * time.Millisecond, 0, "openai", "", false, false, 0}, true},
		{"openai bad durations", header(
			"x-ratelimit-remaining-requests", "3",
			"x-ratelimit-reset-requests", "-1s",
		), Quota{-1, 3, 0, 0, "openai", "", false, false, 0}, true},

		// Anthropic.
		{"anthropic", header(
			"Date", httpDate(now),
			"anthropic-ratelimit-requests-limit", "50",
			"anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", now.Add(time.Minute).Format(time.RFC3339),
			"anthropic-ratelimit-tokens-remaining", "100",
		), Quota{50, 0, time.Minute, 0, "anthropic", "", true, true, 0}, true},
		{"anthropic skew", header(
			"Date", httpDate(serverNow),
			"anthropic-ratelimit-requests-remaining", "4",
			"anthropic-ratelimit-requests-reset", serverNow.Add(12*time.Second).Format(time.RFC3339),
		), Quota{-1, 4, 12 * time.Second, 0, "anthropic", "", true, true, 0}, true},
		{"anthropic fractional seconds and offset", header(
			"anthropic-ratelimit-requests-remaining", "4",
			"anthropic-ratelimit-requests-reset", now.Add(1500*time.Millisecond).In(time.FixedZone("", -5*3600)).Format(time.RFC3339Nano),
		), Quota{-1, 4, 1500 * time.Millisecond, 0, "anthropic", "", false, true, 0}, true},

		// IETF drafts 08-10.
		{"ietf single policy", header(
			"RateLimit-Policy", `"default";q=100;w=60`,
			"RateLimit", `"default";r=50;t=30`,
		), Quota{100, 50, 30 * time.Second, time.Minute, "ietf", "default", true, false, 0}, true},
		{"ietf multi-policy across lines", header(
			"RateLimit-Policy", `"burst";q=100;w=60`,
			"RateLimit-Policy", `"daily";q=1000;w=86400`,
			"RateLimit", `"burst";r=50;t=30, "daily";r=100;t=3600`,
		), Quota{1000, 100, time.Hour, 24 * time.Hour, "ietf", "daily", true, false, 0}, true},
		{"ietf exhausted policy wins", header(
			"RateLimit-Policy", `"burst";q=100;w=60, "daily";q=1000;w=86400`,
			"RateLimit", `"daily";r=900;t=3600`,
			"RateLimit", `"burst";r=0;t=10`,
		), Quota{100, 0, 10 * time.Second, time.Minute, "ietf", "burst", true, false, 0}, true},
		{"ietf longest exhausted reset wins", header(
			"RateLimit-Policy", `"burst";q=100;w=60, "daily";q=1000;w=86400`,
			"RateLimit", `"burst";r=0;t=10, "daily";r=0;t=3000`,
		), Quota{1000, 0, 3000 * time.Second, 24 * time.Hour, "ietf", "daily", true, false, 0}, true},
		{"ietf tokens and unknown params", header(
			"RateLimit-Policy", `burst;q=100;w=60;pk=:cHsdsRa894==:;qu="requests";x=?1`,
			"RateLimit", `burst;r=5;t=2;pk=:cHsdsRa894==:`,
		), Quota{100, 5, 2 * time.Second, time.Minute, "ietf", "burst", true, false, 0}, true},
		{"ietf non-request quota skipped", header(
			"RateLimit-Policy", `"bytes";q=65536;w=1;qu="content-bytes", "reqs";q=10;w=1`,
			"RateLimit", `"bytes";r=0;t=1, "reqs";r=9;t=1`,
		), Quota{10, 9, time.Second, time.Second, "ietf", "reqs", true, false, 0}, true},
		{"ietf escaped name", header(
			"RateLimit-Policy", `"a\"b\\c";q=5`,
			"RateLimit", `"a\"b\\c";r=1`,
		), Quota{5, 1, 0, 0, "ietf", `a"b\c`, false, false, 0}, true},
		{"ietf RateLimit without policy", header("RateLimit", `"default";r=3;t=9`),
			Quota{-1, 3, 9 * time.Second, 0, "ietf", "default", true, false, 0}, true},
		{"ietf policy without RateLimit", header("RateLimit-Policy", `"default";q=100;w=60`),
			Quota{100, -1, 0, time.Minute, "ietf", "default", false, false, 0}, true},
		{"ietf inner list and other members ignored", header(
			"RateLimit-Policy", `(1 2);q=1, 5;q=1, ?1, "p";q=7;w=10`,
		), Quota{7, -1, 0, 10 * time.Second, "ietf", "p", false, false, 0}, true},
		{"ietf out-of-range params ignored", header(
			"RateLimit-Policy", `"p";q=-1;w=99999999`,
			"RateLimit", `"p";r=4;t=1.5`,
		), Quota{-1, 4, 0, 0, "ietf", "p", false, false, 0}, true},
		{"ietf malformed list ignored", header(
			"RateLimit-Policy", `"p";q=1,`,
			"RateLimit", `"p";r=4;t=2 junk`,
		), Quota{}, false},
		{"ietf too many members ignored", header(
			"RateLimit-Policy", strings.Repeat(`a;q=1, `, maxListMembers)+`b;q=1`,
		), Quota{}, false},
		{"ietf too long ignored", header(
			"RateLimit-Policy", `"p";q=1;w=1;x="`+strings.Repeat("x", maxFieldLen)+`"`,
		), Quota{}, false},

		// IETF draft 07.
		{"draft07 fields", header(
			"RateLimit-Limit", "100",
			"RateLimit-Remaining", "50",
			"RateLimit-Reset", "30",
		), Quota{100, 50, 30 * time.Second, 0, "ietf-draft07", "", true, false, 0}, true},
		{"draft07 limit with policy", header(
			"RateLimit-Limit", "100, 100;w=60",
			"RateLimit-Remaining", "50",
		), Quota{100, 50, 0, time.Minute, "ietf-draft07", "", false, false, 0}, true},
		{"draft07 dictionary", header("RateLimit", "limit=100, remaining=50, reset=30"),
			Quota{100, 50, 30 * time.Second, 0, "ietf-draft07", "", true, false, 0}, true},
		{"draft07 dictionary any order, last wins", header("RateLimit", "reset=30, remaining=50, remaining=40"),
			Quota{-1, 40, 30 * time.Second, 0, "ietf-draft07", "", true, false, 0}, true},
		{"draft07 fields beat dictionary", header(
			"RateLimit-Remaining", "7",
			"RateLimit", "limit=100, remaining=50, reset=30",
		), Quota{100, 7, 30 * time.Second, 0, "ietf-draft07", "", true, false, 0}, true},
		{"draft07 decimal reset rejected", header("RateLimit-Reset", "1.5"), Quota{}, false},

		// Several families.
		{"lowest rate across families", header(
			"x-ratelimit-limit-requests", "10000",
			"x-ratelimit-remaining-requests", "9000",
			"x-ratelimit-reset-requests", "1s",
			"X-RateLimit-Limit", "100",
			"X-RateLimit-Remaining", "10",
			"X-RateLimit-Reset", "20",
		), Quota{100, 10, 20 * time.Second, 0, "x-ratelimit", "", true, false, 0}, true},
		{"known rate beats unknown reset", header(
			"x-ratelimit-remaining-requests", "1",
			"X-RateLimit-Remaining", "500",
			"X-RateLimit-Reset", "20",
		), Quota{-1, 500, 20 * time.Second, 0, "x-ratelimit", "", true, false, 0}, true},
		{"refilled exhausted quota ranks last", header(
			"X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", unix(now.Add(-time.Second)),
			"x-ratelimit-remaining-requests", "500",
			"x-ratelimit-reset-requests", "20s",
		), Quota{-1, 500, 20 * time.Second, 0, "openai", "", true, false, 0}, true},
		{"exhausted with unknown reset beats positive rate", header(
			"X-RateLimit-Remaining", "1",
			"X-RateLimit-Reset", "60",
			"anthropic-ratelimit-requests-remaining", "0",
		), Quota{-1, 0, 0, 0, "anthropic", "", false, false, 0}, true},
		{"smallest remaining when rates unknown", header(
			"x-ratelimit-remaining-requests", "9",
			"anthropic-ratelimit-requests-remaining", "3",
		), Quota{-1, 3, 0, 0, "anthropic", "", false, false, 0}, true},
		{"tie goes to earlier family", header(
			"X-RateLimit-Remaining", "10",
			"X-RateLimit-Reset", "10",
			"x-ratelimit-remaining-requests", "10",
			"x-ratelimit-reset-requests", "10s",
		), Quota{-1, 10, 10 * time.Second, 0, "x-ratelimit", "", true, false, 0}, true},

		{"nothing", header("Content-Type", "application/json"), Quota{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Parse(tt.h, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Parse(%v) =\n\t%+v, %v; want\n\t%+v, %v", tt.h, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestParseGitHubResponse parses a GitHub response as it comes off the wire.
func TestParseGitHubResponse(t *testing.T) {
	raw := "HTTP/1.1 403 Forbidden\r\n" +
		"Date: Tue, 02 Jan 2024 15:04:05 GMT\r\n" +
		"Content-Type: application/json; charset=utf-8\r\n" +
		"x-github-request-id: CDE6:2F0B:5B6C2E:5D8B8E:6594259D\r\n" +
		"x-ratelimit-limit: 60\r\n" +
		"x-ratelimit-remaining: 0\r\n" +
		"x-ratelimit-reset: " + unix(now.Add(42*time.Minute)) + "\r\n" +
		"x-ratelimit-resource: core\r\n" +
		"x-ratelimit-used: 60\r\n" +
		"Content-Length: 0\r\n\r\n"
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The client's clock runs 5s ahead; the Date header absorbs that.
	q, ok := Parse(resp.Header, now.Add(5*time.Second))
	want := Quota{60, 0, 42 * time.Minute, 0, "github", "core", true, true, 0}
	if !ok || q != want {
		t.Errorf("Parse = %+v, %v; want %+v, true", q, ok, want)
	}
	if d, ok := RetryAfter(resp.Header, now, time.Hour); ok {
		t.Errorf("RetryAfter = %v, true; want false", d)
	}
}

func TestValidGoDuration(t *testing.T) {
	for _, s := range []string{"0", "1s", "20ms", "6m0s", "1h2m3.5s", "1.5h", "3us", "3µs", "3μs", "7ns", "0s"} {
		if !validGoDuration(s) {
			t.Errorf("validGoDuration(%q) = false", s)
		}
	}
	for _, s := range []string{"", "-1s", "+1s", ".5s", "5.s", "1", "1x", "s", "1s ", "1e3s", "1..5s", "NaN", "1h-2m"} {
		if validGoDuration(s) {
			t.Errorf("validGoDuration(%q) = true", s)
		}
	}
}

func TestParseDecimal(t *testing.T) {
	tests := []struct {
		s           string
		whole, frac int64
		ok          bool
	}{
		{"0", 0, 0, true},
		{"1700000000.5", 1700000000, 5e8, true},
		{"1.123456789123", 1, 123456789, true},
		{"999999999999999999", 999999999999999999, 0, true},
		{"9999999999999999999", 0, 0, false},
		{"", 0, 0, false},
		{"-1", 0, 0, false},
		{"1.", 0, 0, false},
		{".1", 0, 0, false},
		{"1.2.3", 0, 0, false},
		{"1e3", 0, 0, false},
		{"١", 0, 0, false}, // ARABIC-INDIC DIGIT ONE
	}
	for _, tt := range tests {
		w, f, ok := parseDecimal(tt.s)
		if w != tt.whole || f != tt.frac || ok != tt.ok {
			t.Errorf("parseDecimal(%q) = %d, %d, %v; want %d, %d, %v", tt.s, w, f, ok, tt.whole, tt.frac, tt.ok)
		}
	}
}

// ordinaryHeaders are the fields a typical API response carries besides
// any rate-limit fields: BenchmarkParse pays for walking past them.
var ordinaryHeaders = []string{
	"Date", "Tue, 02 Jan 2024 15:04:05 GMT",
	"Content-Type", "application/json; charset=utf-8",
	"Content-Length", "5123",
	"Cache-Control", "private, max-age=60, s-maxage=60",
	"Vary", "Accept, Authorization, Cookie, X-GitHub-OTP",
	"Vary", "Accept-Encoding, Accept, X-Requested-With",
	"Etag", `W/"0123456789abcdef0123456789abcdef"`,
	"Last-Modified", "Mon, 01 Jan 2024 12:00:00 GMT",
	"Server", "github.com",
	"Strict-Transport-Security", "max-age=31536000; includeSubdomains; preload",
	"X-Frame-Options", "deny",
	"X-Content-Type-Options", "nosniff",
	"X-Xss-Protection", "0",
	"Referrer-Policy", "origin-when-cross-origin, strict-origin-when-cross-origin",
	"Content-Security-Policy", "default-src 'none'",
	"Access-Control-Allow-Origin", "*",
	"X-Request-Id", "req_0123456789abcdef",
}

// BenchmarkParse parses typical responses: GitHub's (an epoch reset, so the
// Date field is needed), OpenAI's (delays only, with token fields Parse
// ignores), and one with no rate-limit fields at all, which is what most
// responses look like; and a minimal response, such as a small server
// sends, with the fields GitHub's has and little else.
func BenchmarkParse(b *testing.B) {
	for _, bm := range []struct {
		name string
		kv   []string
		ok   bool
	}{
		{"minimal", []string{
			"Date", "Tue, 02 Jan 2024 15:04:05 GMT",
			"Content-Type", "application/json",
			"Content-Length", "42",
			"X-Ratelimit-Limit", "5000",
			"X-Ratelimit-Remaining", "4987",
			"X-Ratelimit-Reset", unix(now.Add(42 * time.Minute)),
		}, true},
		{"github", []string{
			"X-Github-Request-Id", "CDE6:2F0B:5B6C2E:5D8B8E:6594259D",
			"X-Github-Media-Type", "github.v3; format=json",
			"X-Ratelimit-Limit", "5000",
			"X-Ratelimit-Remaining", "4987",
			"X-Ratelimit-Reset", unix(now.Add(42 * time.Minute)),
			"X-Ratelimit-Used", "13",
			"X-Ratelimit-Resource", "core",
		}, true},
		{"openai", []string{
			"Openai-Organization", "user-abc123",
			"Openai-Processing-Ms", "312",
			"Openai-Version", "2020-10-01",
			"x-ratelimit-limit-requests", "10000",
			"x-ratelimit-limit-tokens", "2000000",
			"x-ratelimit-remaining-requests", "9999",
			"x-ratelimit-remaining-tokens", "1999985",
			"x-ratelimit-reset-requests", "6ms",
			"x-ratelimit-reset-tokens", "0s",
		}, true},
		{"none", nil, false},
	} {
		h := header(bm.kv...)
		if bm.name != "minimal" {
			h = header(append(append([]string(nil), ordinaryHeaders...), bm.kv...)...)
		}
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := Parse(h, now); ok != bm.ok {
					b.Fatalf("Parse ok = %v; want %v", ok, bm.ok)
				}
			}
		})
	}
}

func TestParseTokens(t *testing.T) {
	tests := []struct {
		name   string
		h      http.Header
		want   Quota
		wantOK bool
	}{
		{"openai", header(
			"x-ratelimit-limit-requests", "500",
			"x-ratelimit-remaining-requests", "499",
			"x-ratelimit-limit-tokens", "30000",
			"x-ratelimit-remaining-tokens", "0",
			"x-ratelimit-reset-tokens", "7.66s",
		), Quota{30000, 0, 7660 * time.Millisecond, 0, "openai", "tokens", false, false, 0}, true},
		{"openai whole seconds", header("x-ratelimit-remaining-tokens", "10", "x-ratelimit-reset-tokens", "1m0s"),
			Quota{-1, 10, time.Minute, 0, "openai", "tokens", true, false, 0}, true},
		{"anthropic output binds", header(
			"Date", httpDate(now),
			"anthropic-ratelimit-input-tokens-limit", "40000",
			"anthropic-ratelimit-input-tokens-remaining", "39000",
			"anthropic-ratelimit-input-tokens-reset", now.Add(2*time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-output-tokens-limit", "8000",
			"anthropic-ratelimit-output-tokens-remaining", "0",
			"anthropic-ratelimit-output-tokens-reset", now.Add(30*time.Second).Format(time.RFC3339),
		), Quota{8000, 0, 30 * time.Second, 0, "anthropic", "output-tokens", true, true, 0}, true},
		{"requests only", header("x-ratelimit-remaining-requests", "3"), Quota{}, false},
		{"garbage", header("x-ratelimit-remaining-tokens", "-4", "x-ratelimit-reset-tokens", "soon"), Quota{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseTokens(tt.h, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseTokens =\n\t%+v, %v; want\n\t%+v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestParseCoarse(t *testing.T) {
	for _, c := range []struct {
		name   string
		h      http.Header
		coarse bool
	}{
		{"delta seconds", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1"), true},
		{"fractional delta", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "0.02"), false},
		{"openai ms", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "120ms"), false},
		{"openai s", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1s"), true},
		{"anthropic fraction", header("anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", now.Add(1500*time.Millisecond).Format(time.RFC3339Nano)), false},
		{"ietf t", header("RateLimit", `"default";r=0;t=1`), true},
	} {
		q, ok := Parse(c.h, now)
		if !ok || q.Coarse != c.coarse {
			t.Errorf("%s: Parse = %+v, %v; want Coarse %v", c.name, q, ok, c.coarse)
		}
	}
}

// A Date field within its one-second resolution of our clock leaves resets
// measured on ours: the reset of a one-second window is under a second
// away, not a whole second. A Date far off ours is the server's clock, and
// the reset is read on it.
func TestParseResetReference(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 7, 990_000_000, time.UTC) // 10 ms before the window ends
	reset := strconv.FormatInt(now.Unix()+1, 10)
	for _, c := range []struct {
		name string
		date time.Time
		want time.Duration
	}{
		{"no skew", now, 10 * time.Millisecond},
		{"server 0.9 s behind", now.Add(-900 * time.Millisecond), 10 * time.Millisecond},
		// On the server's clock the reset has passed.
		{"server a minute ahead", now.Add(time.Minute), 0},
		// Read from Date, which truncates 09:59:07.99 to 09:59:07: up to a
		// second long, on the safe side.
		{"server a minute behind", now.Add(-time.Minute), time.Minute + time.Second},
	} {
		h := http.Header{
			"X-Ratelimit-Limit": {"50"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {reset},
			"Date": {c.date.UTC().Format(http.TimeFormat)},
		}
		q, ok := Parse(h, now)
		if !ok {
			t.Fatalf("%s: no quota", c.name)
		}
		if q.Reset != c.want {
			t.Errorf("%s: Reset = %v, want %v", c.name, q.Reset, c.want)
		}
	}
}

// Discord's reset is an instant with milliseconds, and its delay is stated
// too: the delay wins, as an instant measured against a Date of whole
// seconds may be a second off.
func TestParseDiscordResetAfter(t *testing.T) {
	h := http.Header{}
	h.Set("Date", httpDate(now))
	h.Set("X-RateLimit-Limit", "5")
	h.Set("X-RateLimit-Remaining", "2")
	h.Set("X-RateLimit-Reset", fmt.Sprintf("%d.750", now.Add(time.Second).Unix()))
	h.Set("X-RateLimit-Reset-After", "0.321")
	h.Set("X-RateLimit-Bucket", "41f9a2")
	q, ok := Parse(h, now.Add(400*time.Millisecond))
	if !ok || q.Reset != 321*time.Millisecond || q.Remaining != 2 || q.Limit != 5 || q.Coarse || !q.Instant {
		t.Errorf("Parse = %+v, %v; want Reset 321ms from Reset-After, not coarse", q, ok)
	}
	h.Set("X-RateLimit-Reset-After", "soon")
	if q, _ := Parse(h, now); q.Reset != 1750*time.Millisecond {
		t.Errorf("with a malformed Reset-After: Reset %v, want the instant's 1.75s", q.Reset)
	}
}
