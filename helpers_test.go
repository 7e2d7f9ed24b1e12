package sluice

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks, after every test outside a synctest bubble, that no
// goroutine was left behind. Tests inside bubbles are checked by
// synctest.Test itself, which fails when bubble goroutines outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeBase is an in-memory base RoundTripper: it records when each request
// arrived and answers after latency (virtual time inside a bubble).
type fakeBase struct {
	mu       sync.Mutex
	arrivals []arrival
	latency  time.Duration
	inFlight int
	maxIn    int
	answer   func(req *http.Request) *http.Response // nil: 200 "ok"
}

type arrival struct {
	at    time.Time
	class string
}

func (f *fakeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	f.mu.Lock()
	f.arrivals = append(f.arrivals, arrival{time.Now(), req.Header.Get("X-Class")})
	f.inFlight++
	f.maxIn = max(f.maxIn, f.inFlight)
	lat := f.latency
	f.mu.Unlock()
	if lat > 0 {
		select {
		case <-time.After(lat):
		case <-req.Context().Done():
			f.done()
			return nil, req.Context().Err()
		}
	}
	var resp *http.Response
	if f.answer != nil {
		resp = f.answer(req)
	} else {
		resp = &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok\n"))}
	}
	resp.Request = req
	resp.Body = &doneBody{ReadCloser: resp.Body, f: f}
	return resp, nil
}

func (f *fakeBase) done() {
	f.mu.Lock()
	f.inFlight--
	f.mu.Unlock()
}

func (f *fakeBase) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ts := make([]time.Time, len(f.arrivals))
	for i, a := range f.arrivals {
		ts[i] = a.at
	}
	return ts
}

// doneBody tells fakeBase when the client is done with a response: at EOF
// or when it is closed.
type doneBody struct {
	io.ReadCloser
	f    *fakeBase
	once sync.Once
}

func (b *doneBody) Close() error {
	b.once.Do(b.f.done)
	return b.ReadCloser.Close()
}

// Read counts the response done at EOF, as sluice does: the client may
// close the body later, after another attempt was let through.
func (b *doneBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.f.done)
	}
	return n, err
}

func mustNew(t testing.TB, base http.RoundTripper, opts ...Option) *Transport {
	t.Helper()
	tr, err := New(base, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return tr
}

// get sends a GET through tr with the given context and class tag, reads and
// closes the body, and returns the error.
func get(ctx context.Context, tr http.RoundTripper, class string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/x", nil)
	if err != nil {
		return err
	}
	if class != "" {
		req.Header.Set("X-Class", class)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}
