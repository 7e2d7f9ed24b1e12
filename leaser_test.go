package sluice

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeLeaser is a Leaser whose test hands out shares by hand.
type fakeLeaser struct {
	memBackend
	decline bool

	mu     sync.Mutex
	lanes  []fakeLane
	joined int
}

type fakeLane struct {
	key    string
	demand func() (Demand, bool)
	grant  func(Share)
}

func (f *fakeLeaser) Join(key string, demand func() (Demand, bool), grant func(Share)) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.joined++
	if f.decline {
		return false
	}
	f.lanes = append(f.lanes, fakeLane{key, demand, grant})
	return true
}

// grantAll grants s to every lane joined.
func (f *fakeLeaser) grantAll(s Share) {
	f.mu.Lock()
	lanes := append([]fakeLane(nil), f.lanes...)
	f.mu.Unlock()
	for _, l := range lanes {
		l.grant(s)
	}
}

func (f *fakeLeaser) demands() []Demand {
	f.mu.Lock()
	lanes := append([]fakeLane(nil), f.lanes...)
	f.mu.Unlock()
	var ds []Demand
	for _, l := range lanes {
		if d, ok := l.demand(); ok {
			ds = append(ds, d)
		}
	}
	return ds
}

// okBase answers every request with 200 and counts them.
type okBase struct {
	mu sync.Mutex
	at []time.Time
}

func (b *okBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.at = append(b.at, time.Now())
	b.mu.Unlock()
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Header: http.Header{}, Request: r}, nil
}

func (b *okBase) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.at)
}

// A leased lane sends nothing before its first share, paces itself at the
// share it is granted (below its own rate) with no call to Take or Done,
// follows a new share, and reports its demand by level.
func TestLeasedLanePacesAtShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{memBackend: *newMemBackend()}
		base := &okBase{}
		tr, err := New(base, WithRate(100, time.Second), WithBurst(1), WithBackend(f), WithRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range 4 {
			p := Batch
			if i == 0 {
				p = Interactive
			}
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(WithPriority(ctx, p), "GET", "http://api.test/", nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			})
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := base.count(); n != 0 {
			t.Errorf("%d requests sent before the first share", n)
		}
		ds := f.demands()
		if len(ds) != 1 || ds[0].Waiting[Interactive] != 1 || ds[0].Waiting[Batch] != 3 || ds[0].Rate != 100 {
			t.Errorf("demand before the first share: %+v; want 1 Interactive and 3 Batch waiting, rate 100", ds)
		}

		f.grantAll(Share{Rate: 10, Burst: 1, InFlight: -1})
		time.Sleep(10 * time.Second)
		n := base.count()
		// One at the grant (a share starts full), then 10 a second.
		if n < 100 || n > 102 {
			t.Errorf("%d sent in 10s at a share of 10/s", n)
		}
		f.grantAll(Share{Rate: 50, Burst: 1, InFlight: -1})
		time.Sleep(10 * time.Second)
		if got := base.count() - n; got < 499 || got > 502 {
			t.Errorf("%d sent in 10s at a share of 50/s", got)
		}
		ds = f.demands()
		if len(ds) != 1 || ds[0].Granted[Batch] == 0 || ds[0].Granted[Interactive] == 0 {
			t.Errorf("demand after: %+v; want grants at both levels", ds)
		}
		f.mu.Lock()
		takes, dones := f.takes, f.dones
		f.mu.Unlock()
		if takes != 0 || dones != 0 {
			t.Errorf("a leased lane called Take %d and Done %d times", takes, dones)
		}
		cancel()
		wg.Wait()
	})
}

// A share's in-flight cap bounds the lane's attempts in flight; a share of
// none stops it, and a declined Join makes the lane take tokens per attempt.
func TestLeasedLaneInFlightAndDecline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{memBackend: *newMemBackend()}
		release := make(chan struct{})
		var (
			mu  sync.Mutex
			in  int
			top int
		)
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			in++
			top = max(top, in)
			mu.Unlock()
			<-release
			mu.Lock()
			in--
			mu.Unlock()
			return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
		})
		tr, err := New(base, WithBackend(f), WithRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", "http://api.test/", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			})
		}
		synctest.Wait()
		f.grantAll(Share{Rate: 1000, Burst: 10, InFlight: 3})
		synctest.Wait()
		mu.Lock()
		got := top
		mu.Unlock()
		if got != 3 {
			t.Errorf("%d in flight under a share of 3", got)
		}
		close(release)
		wg.Wait()

		d := &fakeLeaser{memBackend: *newMemBackend(), decline: true}
		tr2, err := New(&okBase{}, WithRate(10, time.Second), WithBackend(d), WithRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		defer tr2.Close()
		req, _ := http.NewRequest("GET", "http://api.test/", nil)
		resp, err := tr2.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		synctest.Wait() // Done runs on a goroutine of its own
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.joined != 1 || d.takes == 0 || d.dones != 1 {
			t.Errorf("declined: joined %d, takes %d, dones %d; want 1, some, 1", d.joined, d.takes, d.dones)
		}
	})
}

// TestGoneLaneReportsWhatItHolds: a lane's demand reports false once its
// Transport is closed, and then the level of each budget it was granted
// and did not spend, for the Leaser to give back; a grant that reaches it
// after counts in that level.
func TestGoneLaneReportsWhatItHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{}
		tr := mustNew(t, &okBase{}, WithRate(10, time.Second), WithBudget("tokens", 10000, time.Hour), WithBackend(f))
		done := make(chan error)
		go func() { done <- get(WithCost(t.Context(), "tokens", 1000), tr, "") }()
		synctest.Wait()
		f.grantAll(Share{Rate: 10, Burst: 1, InFlight: -1, Budgets: []BudgetShare{{Add: 5000, Rate: -1, Margin: -1}}})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tr.Close()
		f.mu.Lock()
		l := f.lanes[0]
		f.mu.Unlock()
		d, ok := l.demand()
		if ok || len(d.Budgets) != 1 || d.Budgets[0].Name != "tokens" || d.Budgets[0].Level != 4000 {
			t.Errorf("demand of a closed lane: %v, %+v; want false and the 4,000 tokens it holds", ok, d.Budgets)
		}
		// A give-back of a refresh under way as the lane went reaches it
		// after: the Leaser counted it, and the final level does too.
		l.grant(Share{Rate: 10, Burst: 1, InFlight: -1, Budgets: []BudgetShare{{Add: -1000, Rate: -1, Margin: -1}}})
		if d, _ := l.demand(); len(d.Budgets) != 1 || d.Budgets[0].Level != 3000 {
			t.Errorf("after a give-back of 1,000 reached the closed lane: %+v, want 3,000 held", d.Budgets)
		}
	})
}
