package sluicestatus

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
)

//go:embed page.html
var page []byte

// A Handler serves the status page of one Transport and samples its Stats
// in the background: every WithInterval (1 s) into a history of the last
// WithHistory (10 minutes), for at most WithMaxLanes (20) lanes. With more
// lanes than that it shows the busiest, by requests granted per second
// plus in flight plus queued, smoothed over about the last five samples. A
// lane is shown from the first sample after its first request; its history
// starts then and is dropped when it is no longer shown. Its memory is
// bounded by MaxLanes x History / Interval samples of 128 bytes (1.5 MB at
// the defaults), plus a few counters per lane of the Transport.
//
// The sampler is a goroutine started by New and stopped by Close: a Handler
// must be closed, before or after its Transport. The zero Handler is not
// usable; New makes one. A Handler is safe for concurrent use; serving a
// request copies the lanes shown and takes no lock of the Transport.
type Handler struct {
	t    *sluice.Transport
	cfg  config
	hist *history
	now  func() time.Time

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// New returns a Handler for t, and starts its sampler; Close stops it. It
// returns an error matching ErrInvalidOption when an option is invalid.
func New(t *sluice.Transport, opts ...Option) (*Handler, error) {
	if t == nil {
		return nil, invalid("New: nil Transport")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		t:    t,
		cfg:  cfg,
		hist: newHistory(cfg.samples(), cfg.maxLanes),
		now:  time.Now,
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	// The first sample sets the counters the next one takes differences
	// from, so that the first rate shown is a rate.
	h.hist.record(h.now(), t.Stats())
	go h.sample()
	return h, nil
}

// sample records the Transport's Stats every interval until Close.
func (h *Handler) sample() {
	defer close(h.done)
	tick := time.NewTicker(h.cfg.interval)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
			h.hist.record(h.now(), h.t.Stats())
		}
	}
}

// Close stops the sampler and waits for it to exit. The Handler still
// serves the page afterwards, with the history it has. Close may be called
// more than once.
func (h *Handler) Close() error {
	h.once.Do(func() { close(h.stop) })
	<-h.done
	return nil
}

// ServeHTTP serves the page, or its figures as JSON when the query has
// format=json. It answers GET and HEAD only.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "sluicestatus: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	hd := w.Header()
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	if r.URL.Query().Get("format") == "json" {
		hd.Set("Content-Type", "application/json")
		if r.Method == http.MethodHead {
			return
		}
		enc := json.NewEncoder(w)
		enc.Encode(h.feed(r.URL.Query())) // an error here is the client's going away
		return
	}
	// The policy is the promise of no external asset, kept by the browser:
	// the page may fetch its own origin and nothing else.
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
	hd.Set("Content-Type", "text/html; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	w.Write(page)
}
