package headers

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzNow is the client clock in the fuzz tests; the seeds' dates are near it.
var fuzzNow = time.Date(2024, time.January, 2, 15, 4, 5, 0, time.UTC)

// lines splits s at '\n' so that fuzzed values also exercise multi-line
// fields. net/http never delivers a value containing '\n', but a caller
// may build a Header by hand.
func lines(s string) []string { return strings.Split(s, "\n") }

func FuzzRetryAfter(f *testing.F) {
	date := httpDate(fuzzNow)
	for _, s := range []struct{ ms, msx, ra, date string }{
		{"", "", "120", ""},
		{"", "", "2.0", ""},
		{"", "", "1.5", date},
		{"", "", "Tue, 02 Jan 2024 15:05:35 GMT", date},
		{"", "", "Tuesday, 02-Jan-24 15:05:35 GMT", "Tuesday, 02-Jan-24 15:04:05 GMT"},
		{"", "", "Tue Jan  2 15:05:35 2024", "Tue Jan  2 15:04:05 2024"},
		{"250", "", "", ""},
		{"12.5", "", "", ""},
		{"", "1000", "", ""},
		{"soon", "300", "10", ""},
		{"", "", "-1", ""},
		{"", "", "NaN", ""},
		{"", "", "Inf", ""},
		{"", "", "1e3", ""},
		{"", "", "99999999999999999999", ""},
		{"", "", "9223372036", ""},
		{"", "", "abc", ""},
		{"", "", "Fri, 31 Dec 1999 23:59:59 GMT", ""},
		{"", "", "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT"},
		{"", "", "999999999", date},
		{"0.0000000001", "", "1.0000000019", ""},
		{"", "", "Tue, 02 Jan 2024 15:04:06 UTC", date},
		{"", "", "Tue, 02 Jan 2024 15:04:06 UTC", ""},
		{"", "", "Fri, 31 Dec 9999 23:59:59 UTC", ""},
		{"", "", "Tue, 02 Jan 2024 15:04:06 utc", ""},
	} {
		f.Add(s.ms, s.msx, s.ra, s.date, int64(time.Hour))
	}
	f.Add("1", "", "", "", int64(0))
	f.Add("", "", "5", "", int64(-1))
	f.Fuzz(func(t *testing.T, ms, msx, ra, date string, max int64) {
		h := make(http.Header)
		for k, v := range map[string]string{
			hdrRetryAfterMs: ms, hdrMSRetryAfterMs: msx, hdrRetryAfter: ra, hdrDate: date,
		} {
			if v != "" {
				h[k] = lines(v)
			}
		}
		d, ok := RetryAfter(h, fuzzNow, time.Duration(max))
		if !ok {
			if d != 0 {
				t.Fatalf("RetryAfter = %v, false; want 0 when not ok", d)
			}
			return
		}
		if d <= 0 {
			t.Fatalf("RetryAfter = %v, true; want > 0", d)
		}
		if max > 0 && d > time.Duration(max) {
			t.Fatalf("RetryAfter = %v, true; want <= max %v", d, time.Duration(max))
		}
		// Without a cap the value must be the same or larger.
		if d2, ok2 := RetryAfter(h, fuzzNow, 0); !ok2 || d2 < d {
			t.Fatalf("uncapped RetryAfter = %v, %v; capped gave %v, true", d2, ok2, d)
		}
	})
}

func FuzzParse(f *testing.F) {
	date := httpDate(fuzzNow)
	epoch := unix(fuzzNow.Add(30 * time.Minute))
	for _, s := range []struct{ policy, rl, limit, remaining, reset, date string }{
		// GitHub 403, Twitter, generic epoch and delay resets.
		{"", "", "5000", "0", epoch, date},
		{"", "", "100", "42", "30", ""},
		{"", "", "100", "7", "1700000000.5", "Tue, 14 Nov 2023 22:13:20 GMT"},
		{"", "", "100", "7", "999999999", ""},
		// OpenAI and Anthropic resets.
		{"", "", "10000", "9999", "6m0s", ""},
		{"", "", "10000", "9999", "1h2m3.5s", ""},
		{"", "", "50", "0", "2024-01-02T15:05:05Z", date},
		{"", "", "50", "0", "2024-01-02T10:04:06.5-05:00", ""},
		// IETF drafts 08-10, including a list split across lines.
		{`"default";q=100;w=60`, `"default";r=50;t=30`, "", "", "", ""},
		{"\"burst\";q=100;w=60\n\"daily\";q=1000;w=86400", `"burst";r=50;t=30, "daily";r=100;t=3600`, "", "", "", ""},
		{`burst;q=100;w=60;pk=:cHsdsRa894==:;qu="requests"`, `burst;r=0;t=2`, "", "", "", ""},
		{`"a\"b";q=5, (1 2);q=1, ?1, @1659578233, %"caf%c3%a9"`, `"a\"b";r=1`, "", "", "", ""},
		// IETF draft 07.
		{"", "limit=100, remaining=50, reset=30", "100, 100;w=60", "50", "30", ""},
		// Hostile values.
		{`"p";q=-1;w=99999999`, `"p";r=4;t=1.5`, "10000000000000", "+5", "-3", "yesterday"},
		{"", "", "1e9", "NaN", "99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"},
		// Resets as dates (time.RFC1123 in UTC, and IMF-fixdate).
		{"", "", "50", "0", "Tue, 02 Jan 2024 15:04:06 UTC", date},
		{"", "", "50", "49", "Tue, 02 Jan 2024 15:04:06 GMT", ""},
		{"", "", "50", "3", "Fri, 31 Dec 9999 23:59:59 UTC", ""},
		{"", "", "50", "3", "Tue, 02 Jan 2024 15:04:06 PST", ""},
	} {
		f.Add(s.policy, s.rl, s.limit, s.remaining, s.reset, s.date)
	}
	f.Fuzz(func(t *testing.T, policy, rl, limit, remaining, reset, date string) {
		h := make(http.Header)
		set := func(k, v string) {
			if v != "" {
				h[k] = lines(v)
			}
		}
		set(hdrRateLimitPolicy, policy)
		set(hdrRateLimit, rl)
		set(hdrDate, date)
		set(hdrXRateLimitResource, policy)
		set(hdrXRateLimitUsed, remaining)
		for _, k := range [][3]string{
			{hdrRateLimitLimit, hdrRateLimitRemaining, hdrRateLimitReset},
			{hdrXRateLimitLimit, hdrXRateLimitRemaining, hdrXRateLimitReset},
			{hdrTwitterLimit, hdrTwitterRemaining, hdrTwitterReset},
			{hdrOpenAILimit, hdrOpenAIRemaining, hdrOpenAIReset},
			{hdrAnthropicLimit, hdrAnthropicRemaining, hdrAnthropicReset},
		} {
			set(k[0], limit)
			set(k[1], remaining)
			set(k[2], reset)
		}
		for _, f := range tokenFamilies {
			set(f.limit, limit)
			set(f.remaining, remaining)
			set(f.reset, reset)
		}
		checkTokens(t, h)
		q, ok := Parse(h, fuzzNow)
		if !ok {
			if q != (Quota{}) {
				t.Fatalf("Parse = %+v, false; want zero Quota", q)
			}
			return
		}
		if q.Limit < -1 || q.Limit > maxCount {
			t.Errorf("Limit = %d out of range", q.Limit)
		}
		if q.Remaining < -1 || q.Remaining > maxCount {
			t.Errorf("Remaining = %d out of range", q.Remaining)
		}
		if q.Reset < 0 || q.Reset > maxDuration {
			t.Errorf("Reset = %v out of range", q.Reset)
		}
		if q.Window < 0 || q.Window > maxDuration {
			t.Errorf("Window = %v out of range", q.Window)
		}
		if q.Passed < 0 || q.Passed > maxPassed || q.Passed > 0 && (!q.Instant || q.Reset != 0) {
			t.Errorf("Passed = %v with Reset %v, Instant %v", q.Passed, q.Reset, q.Instant)
		}
		switch q.Source {
		case "ietf", "ietf-draft07", "x-ratelimit", "github", "openai", "anthropic":
		default:
			t.Errorf("Source = %q", q.Source)
		}
		if q.Source == "github" && q.Resource == "" {
			t.Errorf("github quota without Resource: %+v", q)
		}
		// Only the families that state a reset as an instant do.
		if q.Instant && q.Source != "x-ratelimit" && q.Source != "github" && q.Source != "anthropic" {
			t.Errorf("an instant reset from %q: %+v", q.Source, q)
		}
		if q2, ok2 := Parse(h, fuzzNow); q2 != q || !ok2 {
			t.Errorf("Parse not deterministic: %+v then %+v", q, q2)
		}
	})
}

// checkTokens checks ParseTokens's result on h: in range, from a known
// budget, deterministic.
func checkTokens(t *testing.T, h http.Header) {
	q, ok := ParseTokens(h, fuzzNow)
	if !ok {
		if q != (Quota{}) {
			t.Fatalf("ParseTokens = %+v, false; want zero Quota", q)
		}
		return
	}
	if q.Limit < -1 || q.Limit > maxCount || q.Remaining < -1 || q.Remaining > maxCount {
		t.Errorf("ParseTokens: counts out of range: %+v", q)
	}
	if q.Reset < 0 || q.Reset > maxDuration || q.Window != 0 {
		t.Errorf("ParseTokens: durations out of range: %+v", q)
	}
	if q.Coarse && q.Reset%time.Second != 0 && q.Source == "openai" {
		t.Errorf("ParseTokens: coarse OpenAI reset %v is not whole seconds", q.Reset)
	}
	switch q.Resource {
	case "tokens", "input-tokens", "output-tokens":
	default:
		t.Errorf("ParseTokens: Resource = %q", q.Resource)
	}
	if q2, ok2 := ParseTokens(h, fuzzNow); q2 != q || !ok2 {
		t.Errorf("ParseTokens not deterministic: %+v then %+v", q, q2)
	}
}

// gateKeys are the field names FuzzParseGateChangesNothing builds headers
// from: every field Parse reads, Date, other spellings of them that Parse
// must not see (lower case, mixed case, missing or extra hyphens), names
// that share a prefix with them, and ordinary fields.
var gateKeys = []string{
	hdrRateLimitPolicy, hdrRateLimit, hdrRateLimitLimit, hdrRateLimitRemaining, hdrRateLimitReset,
	hdrXRateLimitLimit, hdrXRateLimitRemaining, hdrXRateLimitReset, hdrXRateLimitUsed, hdrXRateLimitResource,
	hdrTwitterLimit, hdrTwitterRemaining, hdrTwitterReset,
	hdrOpenAILimit, hdrOpenAIRemaining, hdrOpenAIReset,
	hdrAnthropicLimit, hdrAnthropicRemaining, hdrAnthropicReset,
	hdrDate,
	"RateLimit-Policy", "ratelimit", "RateLimit-Reset", "x-ratelimit-limit", "X-RateLimit-Reset",
	"x-rate-limit-remaining", "x-ratelimit-reset-requests", "X-RateLimit-Limit-Requests",
	"anthropic-ratelimit-requests-reset", "date", "DATE",
	"Ratelimit-", "Ratelimit-Policies", "Ratelimit-Limit-Requests", "X-Ratelimit", "X-Ratelimit-Limit-",
	"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Reset-Requests-Extra", "X-Rate-Limit", "X-Ratelimit-Limit-Request",
	"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Requests", "Retry-After",
	"Content-Type", "Content-Length", "Etag", "Vary", "Server",
}

// gateHeader decodes b into a header: records of a key byte, a length byte
// and that many value bytes. The key byte's low bits pick a name from
// gateKeys; its top bit, with an empty value, stores the name with no lines
// at all. Values split at '\n' into lines. pad adds that many ordinary
// fields (mod 32), so that headers on both sides of maxGateKeys occur.
func gateHeader(b []byte, pad uint8) http.Header {
	h := make(http.Header)
	for len(b) >= 2 {
		k, n := b[0], int(b[1])
		b = b[2:]
		n = min(n, len(b))
		v := string(b[:n])
		b = b[n:]
		key := gateKeys[int(k&0x7f)%len(gateKeys)]
		if k&0x80 != 0 && v == "" {
			h[key] = []string{}
			continue
		}
		h[key] = append(h[key], lines(v)...)
	}
	for i := range int(pad % 32) {
		h["X-Pad-"+strconv.Itoa(i)] = []string{"1"}
	}
	return h
}

// gateRecords encodes name, value pairs for gateHeader.
func gateRecords(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		k := slices.Index(gateKeys, kv[i])
		if k < 0 {
			panic("no gate key " + kv[i])
		}
		b = append(b, byte(k), byte(len(kv[i+1])))
		b = append(b, kv[i+1]...)
	}
	return b
}

// FuzzParseGateChangesNothing checks that Parse, which reads only the
// families presentFamilies finds and the Date field only when an absolute
// time needs it, agrees with parse reading all families with the reference
// time found up front. The reference is also handed the reference time as
// its now, so that a path that measured from now where it should measure
// from the Date field would disagree.
func FuzzParseGateChangesNothing(f *testing.F) {
	date := httpDate(fuzzNow)
	epoch := unix(fuzzNow.Add(30 * time.Minute))
	for _, kv := range [][]string{
		{hdrXRateLimitLimit, "5000", hdrXRateLimitRemaining, "0", hdrXRateLimitReset, epoch, hdrXRateLimitResource, "core", hdrDate, date},
		{hdrXRateLimitLimit, "60", hdrXRateLimitUsed, "12"},
		{hdrXRateLimitReset, "30", hdrOpenAIReset, "6m0s", "x-ratelimit-limit", "1"},
		{hdrTwitterLimit, "100", hdrTwitterRemaining, "7", hdrTwitterReset, "1700000000.5", hdrDate, "Tue, 14 Nov 2023 22:13:20 GMT"},
		{hdrOpenAILimit, "10000", hdrOpenAIRemaining, "9999", "X-Ratelimit-Limit-Tokens", "2000000"},
		{hdrAnthropicLimit, "50", hdrAnthropicRemaining, "0", hdrAnthropicReset, "2024-01-02T15:05:05Z", hdrDate, date},
		{hdrRateLimitPolicy, `"burst";q=100;w=60`, hdrRateLimit, `"burst";r=0;t=30`},
		{hdrRateLimit, "limit=100, remaining=50, reset=30"},
		{hdrRateLimitLimit, "100, 100;w=60", hdrRateLimitRemaining, "5", hdrRateLimitReset, "2"},
		{hdrRateLimitReset, "7", "Ratelimit-Policies", `"p";q=1`},
		{"RateLimit-Policy", `"p";q=1`, "ratelimit", `"p";r=0`, "x-rate-limit-remaining", "0"},
		{"X-Ratelimit-Limit-", "1", "X-Ratelimit", "1", "Anthropic-Ratelimit-Requests", "1", "Content-Type", "text/plain"},
	} {
		f.Add(gateRecords(kv...), uint8(0), int64(0))
		f.Add(gateRecords(kv...), uint8(0), int64(90*time.Second))
		f.Add(gateRecords(kv...), uint8(20), int64(-time.Hour))
	}
	f.Fuzz(func(t *testing.T, b []byte, pad uint8, skew int64) {
		h := gateHeader(b, pad)
		now := fuzzNow.Add(time.Duration(skew))
		q, ok := Parse(h, now)
		ref := refClock{h: h, now: refTime(h, now)}
		ref.get()
		want, wantOK := parse(h, &ref, allFamilies)
		if q != want || ok != wantOK {
			t.Fatalf("header %q (families %05b):\nParse = %+v, %v\nparse reading all = %+v, %v",
				h, presentFamilies(h), q, ok, want, wantOK)
		}
	})
}
