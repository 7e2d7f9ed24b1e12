package verdict

import (
	"net/http"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		status            int
		retryAfter, empty bool
		want              Kind
	}{
		{0, false, false, Failed},
		{200, false, false, Served},
		{200, true, true, Served}, // a quota spent by this answer is no refusal
		{304, false, false, Served},
		{400, false, false, Served},
		{403, false, false, Served}, // a missing permission
		{403, true, false, Throttled},
		{403, false, true, Throttled},
		{404, false, false, Served},
		{429, false, false, Throttled},
		{429, true, false, Throttled},
		{500, false, false, Errored},
		{500, true, false, Errored},
		{501, false, false, Errored},
		{502, false, false, Overloaded},
		{502, true, false, Paused},
		{503, false, false, Overloaded},
		{503, true, false, Paused},
		{504, false, false, Overloaded},
		{529, false, false, Overloaded},
		{529, true, false, Paused},
		{599, false, false, Errored},
	} {
		if got := Classify(c.status, c.retryAfter, c.empty, Signal{}); got != c.want {
			t.Errorf("Classify(%d, retry-after %v, exhausted %v) = %v, want %v", c.status, c.retryAfter, c.empty, got, c.want)
		}
		if !c.retryAfter && !c.empty {
			if got := Of(c.status); got != c.want {
				t.Errorf("Of(%d) = %v, want %v", c.status, got, c.want)
			}
		}
	}
}

// TestKindRoles: which kinds are latency samples, acceptances and
// refusals; an overload is none of them.
func TestKindRoles(t *testing.T) {
	for k, want := range map[Kind][3]bool{
		Served:     {true, true, false},
		Errored:    {true, false, false},
		Throttled:  {false, false, true},
		Paused:     {false, false, true},
		Overloaded: {false, false, false},
		Failed:     {false, false, false},
	} {
		if got := [3]bool{k.Sample(), k.Accepted(), k.Refused()}; got != want {
			t.Errorf("%v: sample, accepted, refused = %v, want %v", k, got, want)
		}
	}
	if StatusOverloaded != 529 || http.StatusText(StatusOverloaded) != "" {
		t.Errorf("StatusOverloaded %d: want 529, a status net/http does not name", StatusOverloaded)
	}
}

func TestBody(t *testing.T) {
	for _, c := range []struct {
		body string
		want Signal
	}{
		{`{"message":"You have exceeded a secondary rate limit. Please wait"}`, Signal{Secondary: true}},
		{`{"message":"You have triggered an Abuse Detection Mechanism."}`, Signal{Secondary: true}},
		{`{"message":"Resource not accessible by integration"}`, Signal{}},
		{`{"errors":[{"type":"RATE_LIMITED"}]}`, Signal{GraphQL: true}},
		{`{"errors":[{"extensions":{"code":"RATELIMITED"}}]}`, Signal{GraphQL: true}},
		{`{"errors":[{"extensions":{"code":"THROTTLED"}}]}`, Signal{GraphQL: true}},
		{`{"data":{"note":"rate_limited and throttled in prose"}}`, Signal{}},
		{``, Signal{}},
	} {
		if got := Body([]byte(c.body)); got != c.want {
			t.Errorf("Body(%s) = %+v, want %+v", c.body, got, c.want)
		}
		if got := Classify(200, false, false, Body([]byte(c.body))); (got == Throttled) != c.want.Throttles() {
			t.Errorf("a 200 with %s: %v", c.body, got)
		}
	}
}

// TestHeadersDecide: every status whose kind Retry-After or a spent quota
// changes is one whose headers are read.
func TestHeadersDecide(t *testing.T) {
	for s := 100; s < 600; s++ {
		changes := Classify(s, true, false, Signal{}) != Of(s) || Classify(s, false, true, Signal{}) != Of(s)
		if changes && !HeadersDecide(s) {
			t.Errorf("status %d: its headers change its kind, and HeadersDecide says they need not be read", s)
		}
	}
	if !HeadersDecide(429) {
		t.Error("a 429's Retry-After must be read")
	}
}

// TestPoints: Shopify's extensions.cost, as it answers a query and a
// throttled one, in any spacing; anything else, or a figure out of bounds,
// states nothing.
func TestPoints(t *testing.T) {
	for _, c := range []struct {
		body string
		want Points
	}{
		{`{"data":{"shop":{"name":"x"}},"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":46,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":954,"restoreRate":50.0}}}}`,
			Points{Requested: 101, Actual: 46, Max: 1000, Available: 954, Restore: 50, Stated: true}},
		{"{\"errors\":[{\"message\":\"Throttled\",\"extensions\":{\"code\":\"THROTTLED\"}}],\"extensions\":{\"cost\":{\"requestedQueryCost\": 752, \"actualQueryCost\": null,\n \"throttleStatus\": {\"maximumAvailable\": 2000.0, \"currentlyAvailable\": 34, \"restoreRate\": 100.0}}}}",
			Points{Requested: 752, Actual: -1, Max: 2000, Available: 34, Restore: 100, Stated: true}},
		{`{"extensions":{"cost":{"throttleStatus":{"maximumAvailable":1000,"currentlyAvailable":1e12,"restoreRate":50}}}}`, Points{}},
		{`{"extensions":{"cost":{"throttleStatus":{"maximumAvailable":1000,"currentlyAvailable":-5,"restoreRate":50}}}}`, Points{}},
		{`{"extensions":{"cost":{"throttleStatus":{"maximumAvailable":100,"currentlyAvailable":500,"restoreRate":50}}}}`, Points{}},
		{`{"extensions":{"cost":{"throttleStatus":{"maximumAvailable":1000,"currentlyAvailable":NaN,"restoreRate":50}}}}`, Points{}},
		{`{"extensions":{"cost":{"throttleStatus":{"maximumAvailable":1000,"currentlyAvailable":`, Points{}},
		{`{"data":{}}`, Points{}},
	} {
		if got := Body([]byte(c.body)).Points; got != c.want {
			t.Errorf("Body(%.60q...).Points = %+v, want %+v", c.body, got, c.want)
		}
	}
}

// FuzzBody: any prefix, of any length and content, reads as a Signal whose
// figures keep the bounds Points states: finite, within [0, MaxPoints] (the
// costs -1 when not stated), no more available than the maximum, and all
// zero when no throttleStatus was read.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		`{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`,
		`{"errors":[{"type":"RATE_LIMITED","message":"API rate limit exceeded"}]}`,
		`{"errors":[{"message":"Rate limit exceeded","extensions":{"code":"RATELIMITED"}}]}`,
		`{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED"}}],"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":null,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":50,"restoreRate":50.0}}}}`,
		`{"data":{},"extensions":{"cost":{"requestedQueryCost":12,"actualQueryCost":4,"throttleStatus":{"maximumAvailable":2000,"currentlyAvailable":1996,"restoreRate":100}}}}`,
		`"throttleStatus":{"maximumAvailable":1e308,"currentlyAvailable":-1,"restoreRate":NaN}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := Body(b)
		p := s.Points
		in := func(v float64) bool { return v >= 0 && v <= MaxPoints }
		if !p.Stated {
			if p != (Points{}) {
				t.Fatalf("no throttleStatus read, yet %+v", p)
			}
			return
		}
		if !in(p.Max) || !in(p.Available) || !in(p.Restore) || p.Available > p.Max {
			t.Fatalf("bucket out of bounds: %+v", p)
		}
		for _, c := range []float64{p.Requested, p.Actual} {
			if c != -1 && !in(c) {
				t.Fatalf("cost out of bounds: %+v", p)
			}
		}
		if again := Body(b); again != s {
			t.Fatalf("read twice: %+v, then %+v", s, again)
		}
	})
}

// TestBodyGraphQLCodeOnlyInErrors: a throttle code counts only as an
// error's type or code, in any JSON spacing; the same word as a value in
// data is no throttle.
func TestBodyGraphQLCodeOnlyInErrors(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"data":{"jobs":[{"status":"THROTTLED"}]}}`, false},
		{`{"data":{"labels":[{"name":"RATE_LIMITED"}]}}`, false},
		{`{"data":{"x":{"code":"THROTTLED"}}}`, false}, // no errors key
		{`{"data":null,"errors":[{"type" : "RATE_LIMITED","message":"API rate limit exceeded"}]}`, true},
		{"{\n  \"errors\": [ {\"extensions\": {\"code\":\n \"RATELIMITED\"}} ]\n}", true},
		{`{"errors":[{"message":"\"THROTTLED\" is not a field"}]}`, false},
	} {
		if got := Body([]byte(c.body)).GraphQL; got != c.want {
			t.Errorf("Body(%s).GraphQL = %v, want %v", c.body, got, c.want)
		}
	}
}
