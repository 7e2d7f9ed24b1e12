package upstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// result is what a test needs from one response.
type result struct {
	status int
	header http.Header
	body   string
}

// trySend sends method to s.URL()+path with body and optional headers
// (key, value pairs), reads the whole response body and closes it.
func trySend(s *Server, method, path, body string, kv ...string) (result, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.URL()+path, rd)
	if err != nil {
		return result{}, err
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{resp.StatusCode, resp.Header, string(b)}, nil
}

// send is trySend that fails the test on error. Call it only from the
// test goroutine.
func send(t *testing.T, s *Server, method, path, body string, kv ...string) result {
	t.Helper()
	r, err := trySend(s, method, path, body, kv...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func get(t *testing.T, s *Server) result {
	t.Helper()
	return send(t, s, http.MethodGet, "/", "")
}

// goGet sends a GET from another goroutine and reports problems with
// t.Errorf; it returns when the response has been read.
func goGet(t *testing.T, s *Server) {
	t.Helper()
	r, err := trySend(s, http.MethodGet, "/", "")
	if err != nil {
		t.Errorf("GET: %v", err)
	} else if r.status != http.StatusOK {
		t.Errorf("GET: status %d, want 200", r.status)
	}
}

func wantStatus(t *testing.T, what string, got result, want int) {
	t.Helper()
	if got.status != want {
		t.Fatalf("%s: status %d, want %d (body %q)", what, got.status, want, got.body)
	}
}

func TestGCRAStrictInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Rate: 10, Burst: 1})
		t.Cleanup(s.Close)

		for i := range 10 {
			r := get(t, s)
			wantStatus(t, "on schedule", r, http.StatusOK)
			if i == 0 && r.body != "ok\n" {
				t.Fatalf("body %q, want %q", r.body, "ok\n")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// t = 1s: on schedule again.
		wantStatus(t, "t=1s", get(t, s), http.StatusOK)

		// 1ms early (t = 1.099s, TAT = 1.1s): refused, Retry-After rounds up to 1.
		time.Sleep(99 * time.Millisecond)
		r := get(t, s)
		wantStatus(t, "1ms early", r, http.StatusTooManyRequests)
		if got := r.header.Get("Retry-After"); got != "1" {
			t.Fatalf("Retry-After %q, want \"1\"", got)
		}
		// The refusal did not advance the TAT: 1ms later (exactly on time) is fine.
		time.Sleep(1 * time.Millisecond)
		wantStatus(t, "on time after refusal", get(t, s), http.StatusOK)

		// 1ns early is refused too.
		time.Sleep(100*time.Millisecond - 1)
		wantStatus(t, "1ns early", get(t, s), http.StatusTooManyRequests)
		time.Sleep(time.Nanosecond)
		wantStatus(t, "on time", get(t, s), http.StatusOK)

		acc, rej := s.Counts()
		if acc != 13 || rej != 2 {
			t.Fatalf("Counts() = %d, %d; want 13, 2", acc, rej)
		}
		as := s.Arrivals()
		if len(as) != 15 {
			t.Fatalf("%d arrivals, want 15", len(as))
		}
		if as[11].Accepted || as[11].Status != http.StatusTooManyRequests {
			t.Fatalf("arrival 11 = %+v, want refused 429", as[11])
		}
		if got := as[11].At.Sub(as[0].At); got != 1099*time.Millisecond {
			t.Fatalf("arrival 11 at +%v, want +1.099s", got)
		}
		if n := MaxInWindow(Times(Accepted(as)), time.Second); n != 10 {
			t.Fatalf("MaxInWindow(accepted, 1s) = %d, want 10", n)
		}
	})
}

func TestGCRABurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Rate: 10, Burst: 3})
		defer s.Close()
		for range 3 {
			wantStatus(t, "burst", get(t, s), http.StatusOK)
		}
		r := get(t, s)
		wantStatus(t, "past burst", r, http.StatusTooManyRequests)
		time.Sleep(100 * time.Millisecond)
		wantStatus(t, "after one interval", get(t, s), http.StatusOK)
		wantStatus(t, "still limited", get(t, s), http.StatusTooManyRequests)

		// Lifting the limit lets everything through; restoring it keeps the TAT.
		s.SetRate(0, 0)
		for range 5 {
			wantStatus(t, "unlimited", get(t, s), http.StatusOK)
		}
		s.SetRate(10, 1)
		wantStatus(t, "limited again", get(t, s), http.StatusTooManyRequests)
	})
}

func TestRetryAfterModes(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // nil = header absent
	}{
		{"seconds", Config{RetryAfter: RetryAfterSeconds}, []string{"3"}},
		{"none", Config{RetryAfter: RetryAfterNone}, nil},
		{"fixed NaN", Config{RetryAfter: RetryAfterFixed, RetryAfterValue: "NaN"}, []string{"NaN"}},
		{"fixed huge", Config{RetryAfter: RetryAfterFixed, RetryAfterValue: "99999999999"}, []string{"99999999999"}},
		{"fixed empty", Config{RetryAfter: RetryAfterFixed}, []string{""}},
		// The bubble starts at 2000-01-01 00:00:00 UTC; we ask at +0.5s,
		// the next slot is at +3s (rate 0.4/s).
		{"date", Config{RetryAfter: RetryAfterDate}, []string{"Sat, 01 Jan 2000 00:00:03 GMT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.cfg.Rate, tt.cfg.Burst = 0.4, 1
				s := New(tt.cfg)
				defer s.Close()
				time.Sleep(500 * time.Millisecond)
				wantStatus(t, "first", get(t, s), http.StatusOK)
				r := get(t, s)
				wantStatus(t, "second", r, http.StatusTooManyRequests)
				if got := r.header.Values("Retry-After"); !slices.Equal(got, tt.want) {
					t.Fatalf("Retry-After = %q, want %q", got, tt.want)
				}
			})
		})
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Rate: -1},
		{RetryAfterValue: "NaN"}, // needs RetryAfterFixed
		{RetryAfter: RetryAfterMode(42)},
		{MaxConcurrent: -1},
		{PolicyWindow: -time.Second},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", cfg)
				}
			}()
			New(cfg).Close()
		}()
	}
}

func TestLatencyIsVirtual(t *testing.T) {
	wallStart := time.Now()
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Latency: func(int, *http.Request) time.Duration { return 2 * time.Second }})
		defer s.Close()
		start := time.Now()
		wantStatus(t, "slow", get(t, s), http.StatusOK)
		if got := time.Since(start); got != 2*time.Second {
			t.Fatalf("request took %v of bubble time, want 2s", got)
		}
		a := s.Arrivals()[0]
		if !a.At.Equal(start) || a.Done.Sub(a.At) != 2*time.Second {
			t.Fatalf("arrival %+v: want At=start, Done=At+2s", a)
		}

		// Latency shift at run time; n counts accepted requests.
		var seen []int
		s.SetLatency(func(n int, _ *http.Request) time.Duration {
			seen = append(seen, n)
			return 500 * time.Millisecond
		})
		start = time.Now()
		wantStatus(t, "shifted", get(t, s), http.StatusOK)
		if got := time.Since(start); got != 500*time.Millisecond {
			t.Fatalf("request took %v after SetLatency, want 500ms", got)
		}
		if !slices.Equal(seen, []int{1}) {
			t.Fatalf("latency called with n=%v, want [1]", seen)
		}
	})
	if wall := time.Since(wallStart); wall > 5*time.Second {
		t.Fatalf("bubble test took %v of wall time", wall)
	}
}

func TestMaxConcurrentQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{
			MaxConcurrent: 2,
			Latency:       func(int, *http.Request) time.Duration { return time.Second },
		})
		defer s.Close()

		start := time.Now()
		done := make([]time.Duration, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				goGet(t, s)
				done[i] = time.Since(start)
			})
		}
		wg.Wait()
		if got := time.Since(start); got != 2*time.Second {
			t.Fatalf("4 x 1s requests with MaxConcurrent=2 took %v, want 2s", got)
		}
		ones, twos := 0, 0
		for _, d := range done {
			switch d {
			case time.Second:
				ones++
			case 2 * time.Second:
				twos++
			}
		}
		if ones != 2 || twos != 2 {
			t.Fatalf("completion times %v, want two at 1s and two at 2s", done)
		}
		if got := s.MaxInFlight(); got != 2 {
			t.Fatalf("MaxInFlight() = %d, want 2", got)
		}
		if got := s.MaxOutstanding(); got != 4 {
			t.Fatalf("MaxOutstanding() = %d, want 4", got)
		}
		// FIFO: service starts in arrival order.
		as := s.Arrivals()
		for i := 1; i < len(as); i++ {
			if as[i].Started.Before(as[i-1].Started) {
				t.Fatalf("arrival %d started before arrival %d: %+v", i, i-1, as)
			}
			if as[i].InFlight < 1 || as[i].InFlight > 2 {
				t.Fatalf("arrival %d InFlight = %d, want 1..2", i, as[i].InFlight)
			}
		}
	})
}

func TestIETFHeadersAndQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Quota: 3, PolicyWindow: 10 * time.Second})
		defer s.Close()

		check := func(what string, r result, status int, rl string) {
			t.Helper()
			wantStatus(t, what, r, status)
			if got, want := r.header.Get("RateLimit-Policy"), `"default";q=3;w=10`; got != want {
				t.Fatalf("%s: RateLimit-Policy %q, want %q", what, got, want)
			}
			if got := r.header.Get("RateLimit"); got != rl {
				t.Fatalf("%s: RateLimit %q, want %q", what, got, rl)
			}
		}
		check("first", get(t, s), http.StatusOK, `"default";r=2;t=10`)
		time.Sleep(3 * time.Second)
		check("second", get(t, s), http.StatusOK, `"default";r=1;t=7`)
		time.Sleep(1500 * time.Millisecond)
		check("third", get(t, s), http.StatusOK, `"default";r=0;t=6`) // 5.5s rounds up
		r := get(t, s)
		check("over quota", r, http.StatusTooManyRequests, `"default";r=0;t=6`)
		if got := r.header.Get("Retry-After"); got != "6" {
			t.Fatalf("Retry-After %q, want \"6\"", got)
		}
		time.Sleep(5500 * time.Millisecond) // t = 10s: new window
		check("new window", get(t, s), http.StatusOK, `"default";r=2;t=10`)

		if acc, rej := s.Counts(); acc != 4 || rej != 1 {
			t.Fatalf("Counts() = %d, %d; want 4, 1", acc, rej)
		}
	})
}

func TestQuotaAndRateTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Rate: 1, Burst: 1, Quota: 2, PolicyWindow: 10 * time.Second})
		defer s.Close()
		wantStatus(t, "1st", get(t, s), http.StatusOK)
		// Refused by GCRA: quota is untouched.
		r := get(t, s)
		wantStatus(t, "gcra", r, http.StatusTooManyRequests)
		if got := r.header.Get("RateLimit"); got != `"default";r=1;t=10` {
			t.Fatalf("RateLimit %q after GCRA refusal", got)
		}
		time.Sleep(time.Second)
		wantStatus(t, "2nd", get(t, s), http.StatusOK)
		time.Sleep(time.Second)
		// GCRA would allow, quota refuses until t=10s.
		r = get(t, s)
		wantStatus(t, "quota", r, http.StatusTooManyRequests)
		if got := r.header.Get("Retry-After"); got != "8" {
			t.Fatalf("Retry-After %q, want \"8\"", got)
		}
	})
}

func TestArrivalFields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			w.Write(b)
		}
		s := New(Config{Handler: echo, Rate: 1})
		defer s.Close()

		const body = `{"q":"hello"}`
		r := send(t, s, http.MethodPost, "/v1/items", body, "X-Class", "interactive", "X-Tenant", "acme")
		wantStatus(t, "post", r, http.StatusCreated)
		if r.body != body {
			t.Fatalf("handler saw body %q, want %q", r.body, body)
		}
		// Refused requests are recorded too, with their body hash.
		wantStatus(t, "refused", send(t, s, http.MethodPut, "/v1/items/1", body, "X-Class", "batch"), http.StatusTooManyRequests)

		sum := sha256.Sum256([]byte(body))
		want := hex.EncodeToString(sum[:])
		as := s.Arrivals()
		a := as[0]
		if a.Method != http.MethodPost || a.Path != "/v1/items" || a.Class != "interactive" ||
			a.Tenant != "acme" || a.Status != http.StatusCreated || !a.Accepted || a.BodyHash != want || a.InFlight != 1 {
			t.Fatalf("arrival 0 = %+v", a)
		}
		a = as[1]
		if a.Method != http.MethodPut || a.Class != "batch" || a.Status != http.StatusTooManyRequests ||
			a.Accepted || a.BodyHash != want || !a.Started.IsZero() || !a.Done.Equal(a.At) {
			t.Fatalf("arrival 1 = %+v", a)
		}
	})
}

func TestCloseAbandonsWaitingRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{
			MaxConcurrent: 1,
			Latency:       func(int, *http.Request) time.Duration { return time.Hour },
		})
		errs := make(chan error, 3)
		for range 3 { // one sleeping, two queued
			go func() {
				resp, err := s.Client().Get(s.URL())
				if err == nil {
					resp.Body.Close()
				}
				errs <- err
			}()
		}
		synctest.Wait()
		if as := s.Arrivals(); len(as) != 3 {
			t.Fatalf("%d arrivals before Close, want 3", len(as))
		}
		start := time.Now()
		s.Close()
		for range 3 {
			if err := <-errs; err == nil {
				t.Fatal("request survived Close")
			}
		}
		if time.Since(start) != 0 {
			t.Fatalf("Close took %v of bubble time", time.Since(start))
		}
		for i, a := range s.Arrivals() {
			if a.Status != 0 || a.Done.IsZero() {
				t.Fatalf("arrival %d = %+v, want abandoned (status 0, Done set)", i, a)
			}
		}
		s.Close() // idempotent
		// Returning with the client goroutines gone and no leftover
		// server/transport goroutines is what synctest checks.
	})
}

func TestClientCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{
			MaxConcurrent: 1,
			Latency:       func(int, *http.Request) time.Duration { return time.Second },
		})
		defer s.Close()

		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { goGet(t, s) })
		synctest.Wait()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL(), nil)
		_, err := s.Client().Do(req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("queued request: err %v, want deadline exceeded", err)
		}
		wg.Wait()
		// The canceled waiter left the queue: the next request is served at once.
		start := time.Now()
		wantStatus(t, "after cancel", get(t, s), http.StatusOK)
		if got := time.Since(start); got != time.Second {
			t.Fatalf("request after cancel took %v, want 1s", got)
		}
	})
}

func TestNoLeaksOutsideBubble(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := New(Config{
		Rate:          1000,
		Burst:         1000,
		MaxConcurrent: 3,
		Latency:       func(int, *http.Request) time.Duration { return time.Millisecond },
	})
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { goGet(t, s) })
	}
	wg.Wait()
	if got := s.MaxInFlight(); got < 1 || got > 3 {
		t.Fatalf("MaxInFlight() = %d, want 1..3", got)
	}
	// A request still sleeping when Close is called must not leak either.
	s.SetLatency(func(int, *http.Request) time.Duration { return time.Hour })
	errc := make(chan error, 1)
	go func() {
		resp, err := s.Client().Get(s.URL())
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	for {
		if as := s.Arrivals(); len(as) == 11 && !as[10].Started.IsZero() {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s.Close()
	if err := <-errc; err == nil {
		t.Fatal("request survived Close")
	}
}

func TestTCP(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := NewTCP(Config{Rate: 1, Burst: 2})
	defer s.Close()
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") && !strings.HasPrefix(s.URL(), "http://[::1]:") {
		t.Fatalf("URL %q is not loopback", s.URL())
	}
	wantStatus(t, "1", get(t, s), http.StatusOK)
	wantStatus(t, "2", get(t, s), http.StatusOK)
	wantStatus(t, "3", get(t, s), http.StatusTooManyRequests)
	s.Close()
}

func TestMaxInWindow(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		out := make([]time.Time, len(ms))
		for i, m := range ms {
			out[i] = t0.Add(time.Duration(m) * time.Millisecond)
		}
		return out
	}
	tests := []struct {
		name  string
		times []time.Time
		w     time.Duration
		want  int
	}{
		{"empty", nil, time.Second, 0},
		{"zero window", at(0, 0, 0), 0, 0},
		{"single", at(5), time.Second, 1},
		{"paced 100ms, 1s window", at(0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000), time.Second, 10},
		{"end is exclusive", at(0, 1000), time.Second, 1},
		{"just inside", at(0, 999), time.Second, 2},
		{"simultaneous", at(7, 7, 7, 7), time.Nanosecond, 4},
		{"unsorted input", at(900, 0, 500, 100, 2000, 1950, 1990), 100 * time.Millisecond, 3},
		{"burst in the middle", at(0, 400, 1000, 1001, 1002, 1003, 1800), time.Second, 5},
		{"window wider than span", at(0, 10, 20), time.Hour, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := append([]time.Time(nil), tt.times...)
			if got := MaxInWindow(tt.times, tt.w); got != tt.want {
				t.Fatalf("MaxInWindow = %d, want %d", got, tt.want)
			}
			for i := range orig {
				if !orig[i].Equal(tt.times[i]) {
					t.Fatal("MaxInWindow modified its input")
				}
			}
		})
	}
}

func TestRateHelper(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	var as []Arrival
	for i := range 20 {
		as = append(as, Arrival{At: t0.Add(time.Duration(i) * 100 * time.Millisecond), Accepted: i%4 != 3})
	}
	// [0, 1s): arrivals 0..9, of which 3 and 7 refused.
	if got := Rate(as, t0, t0.Add(time.Second)); got != 8 {
		t.Fatalf("Rate over [0,1s) = %v, want 8", got)
	}
	if got := Rate(as, t0, t0.Add(2*time.Second)); got != 7.5 {
		t.Fatalf("Rate over [0,2s) = %v, want 7.5", got)
	}
	if got := Rate(as, t0, t0); got != 0 {
		t.Fatalf("Rate over empty interval = %v, want 0", got)
	}
	if got := len(Accepted(as)); got != 15 {
		t.Fatalf("len(Accepted) = %d, want 15", got)
	}
}
