package sluice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// countBase answers every request with status and hdr, and counts the
// attempts.
type countBase struct {
	status int
	hdr    http.Header
	n      atomic.Int32
}

func (b *countBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	b.n.Add(1)
	h := http.Header{}
	for k, v := range b.hdr {
		h[k] = v
	}
	return &http.Response{StatusCode: b.status, Header: h, Body: io.NopCloser(strings.NewReader("x")), Request: req}, nil
}

// noWait is a Backoff that does not wait, so retries are immediate.
func noWait(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 0 }

// idleBase counts CloseIdleConnections calls.
type idleBase struct {
	countBase
	closed atomic.Int32
}

func (b *idleBase) CloseIdleConnections() { b.closed.Add(1) }

// TestCloseIdleConnectionsForwarded: http.Client.CloseIdleConnections
// reaches the base.
func TestCloseIdleConnectionsForwarded(t *testing.T) {
	base := &idleBase{countBase: countBase{status: 200}}
	tr := mustNew(t, base)
	c := &http.Client{Transport: tr}
	c.CloseIdleConnections()
	if n := base.closed.Load(); n != 1 {
		t.Errorf("base's CloseIdleConnections called %d times, want 1", n)
	}
	// A base without the method: nothing to forward, no panic.
	(&http.Client{Transport: mustNew(t, &countBase{status: 200})}).CloseIdleConnections()
}

// TestNewNilFollowsDefaultTransport: New(nil) sends through
// http.DefaultTransport as it is when the request is made.
func TestNewNilFollowsDefaultTransport(t *testing.T) {
	tr := mustNew(t, nil)
	base := &idleBase{countBase: countBase{status: 200}}
	old := http.DefaultTransport
	http.DefaultTransport = base
	defer func() { http.DefaultTransport = old }()
	if err := get(context.Background(), tr, ""); err != nil {
		t.Fatal(err)
	}
	if n := base.n.Load(); n != 1 {
		t.Errorf("the current DefaultTransport saw %d requests, want 1", n)
	}
	(&http.Client{Transport: tr}).CloseIdleConnections()
	if n := base.closed.Load(); n != 1 {
		t.Errorf("CloseIdleConnections reached the current DefaultTransport %d times, want 1", n)
	}
}

// TestNilResponseFromBase: a base that returns (nil, nil) gives its
// slot back, and the caller gets an error like net/http's.
func TestNilResponseFromBase(t *testing.T) {
	tr := mustNew(t, rtFunc(func(*http.Request) (*http.Response, error) { return nil, nil }), WithConcurrency(1, 1))
	for range 3 {
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panicked: %v", p)
				}
			}()
			req, _ := http.NewRequest("GET", "http://api.test/", nil)
			var resp *http.Response
			resp, err = tr.RoundTrip(req)
			if resp != nil {
				t.Error("a response with the error")
			}
		}()
		if err == nil || err.Error() != "sluice: RoundTripper returned a nil *Response with a nil error" {
			t.Fatalf("err = %v", err)
		}
	}
	if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
		t.Errorf("in flight %d, want 0", s.InFlight)
	}
}

// TestBasePanicReleasesSlot: a base that panics gives its slot back,
// and the panic reaches the caller unchanged.
func TestBasePanicReleasesSlot(t *testing.T) {
	boom := errors.New("boom")
	tr := mustNew(t, rtFunc(func(*http.Request) (*http.Response, error) { panic(boom) }), WithConcurrency(1, 1))
	for range 3 {
		var p any
		func() {
			defer func() { p = recover() }()
			// A slot never given back would hold this one until the deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			get(ctx, tr, "")
		}()
		if p != boom {
			t.Fatalf("recovered %v, want the base's panic", p)
		}
	}
	if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
		t.Errorf("in flight %d, want 0", s.InFlight)
	}
}

// failingBody fails its first Read.
type failingBody struct{ closed atomic.Bool }

func (b *failingBody) Read([]byte) (int, error) { return 0, errors.New("read: connection reset") }
func (b *failingBody) Close() error             { b.closed.Store(true); return nil }

// TestBodyReadErrorReleasesSlot: a failed Read gives the slot back.
func TestBodyReadErrorReleasesSlot(t *testing.T) {
	tr := mustNew(t, rtFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: &failingBody{}, Request: req}, nil
	}), WithConcurrency(1, 1))
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 8)); err == nil {
		t.Fatal("no read error")
	}
	if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
		t.Errorf("in flight %d after a failed read, want 0", s.InFlight)
	}
}

// TestContextEndReleasesSlot: a response whose request's context
// ends gives its slot back though its body is neither read nor closed.
func TestContextEndReleasesSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithConcurrency(1, 1))
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp // abandoned
		cancel()
		synctest.Wait()
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
			t.Fatalf("in flight %d after the context ended, want 0", s.InFlight)
		}
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // a late close frees nothing more
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
			t.Errorf("in flight %d, want 0", s.InFlight)
		}
	})
}

// logRecorder is a slog.Handler that keeps every record with its context.
type logRecorder struct {
	mu   sync.Mutex
	recs []loggedRecord
}

type loggedRecord struct {
	ctx   context.Context
	level slog.Level
	msg   string
	attrs string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, "%s=%v ", a.Key, a.Value); return true })
	h.mu.Lock()
	h.recs = append(h.recs, loggedRecord{ctx, r.Level, r.Message, b.String()})
	h.mu.Unlock()
	return nil
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

func (h *logRecorder) find(substr string) []loggedRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []loggedRecord
	for _, r := range h.recs {
		if strings.Contains(r.msg, substr) {
			out = append(out, r)
		}
	}
	return out
}

// TestUnreachableBodyReleasesSlot: a response body dropped without
// being closed gives its slot back once it is collected, and the lane warns
// once that a body was not closed.
func TestUnreachableBodyReleasesSlot(t *testing.T) {
	h := &logRecorder{}
	tr := mustNew(t, &countBase{status: 200}, WithConcurrency(1, 1), WithLogger(slog.New(h)))
	leak := func() {
		req, _ := http.NewRequest("GET", "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp
	}
	for i := range 2 {
		leak()
		// Collection is not on a timer: GC until the cleanup has run, for
		// at most a bounded number of cycles.
		for range 200 {
			if s, _ := tr.Stats().Lane("api.test"); s.InFlight == 0 {
				break
			}
			gcAndYield()
		}
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
			t.Fatalf("leak %d: in flight %d after the body was collected, want 0", i, s.InFlight)
		}
	}
	recs := h.find("response body not closed")
	if len(recs) != 1 || recs[0].level != slog.LevelWarn {
		t.Errorf("%d warnings %+v, want one at Warn", len(recs), recs)
	}
}

// gcAndYield runs a collection and lets the cleanup goroutine run.
func gcAndYield() {
	runtime.GC()
	time.Sleep(time.Millisecond)
}
