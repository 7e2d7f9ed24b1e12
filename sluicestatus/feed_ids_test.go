package sluicestatus

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// TestFeedIDsUnique: the page keys a lane's history by the feed's id, so
// a lane keyed "3:abc/x" (WithKey may return any text) and the sub-limit
// "x" of lane "abc" have ids of their own, or their charts would merge.
func TestFeedIDsUnique(t *testing.T) {
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := &Handler{t: tr, cfg: defaultConfig(), hist: newHistory(10, 5), now: time.Now}
	sub := lane("abc", 20, 0)
	sub.Sublimit = "x"
	t0 := time.Unix(1000, 0)
	for i := range 2 {
		h.hist.record(t0.Add(time.Duration(i)*time.Second), sluice.Stats{Lanes: []sluice.LaneStats{lane("3:abc/x", 10, 0), sub}})
	}
	f := h.feed(url.Values{})
	if len(f.Shown) != 2 {
		t.Fatalf("%d lanes shown, want 2", len(f.Shown))
	}
	if f.Shown[0].ID == f.Shown[1].ID {
		t.Errorf("lane %q and sub-limit %q share the id %q", f.Shown[0].Key, f.Shown[1].Key, f.Shown[0].ID)
	}
}

// TestFeedIDsUniqueInvalidUTF8: the page keys each lane's history by
// the id it reads from the JSON feed. encoding/json replaces invalid UTF-8
// with U+FFFD, so lanes keyed "a\xff" and "a\xfe" (a redirect to
// http://%ff/ makes a lane keyed "\xff"; WithKey may return any bytes) and
// "a\uFFFD" have ids of their own once decoded, or their charts would
// merge into one.
func TestFeedIDsUniqueInvalidUTF8(t *testing.T) {
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := &Handler{t: tr, cfg: defaultConfig(), hist: newHistory(10, 10), now: time.Now}
	s1 := lane("a", 5, 0)
	s1.Sublimit = "\xff"
	s2 := lane("a", 6, 0)
	s2.Sublimit = "\xfe"
	lanes := []sluice.LaneStats{lane("a\xff", 10, 0), lane("a\xfe", 11, 0), lane("a\uFFFD", 12, 0), lane("\"x", 13, 0), s1, s2}
	t0 := time.Unix(1000, 0)
	for i := range 2 {
		h.hist.record(t0.Add(time.Duration(i)*time.Second), sluice.Stats{Lanes: lanes})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
	var f feedJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &f); err != nil {
		t.Fatalf("decoding the feed: %v", err)
	}
	if len(f.Shown) != len(lanes) {
		t.Fatalf("%d lanes shown, want %d", len(f.Shown), len(lanes))
	}
	seen := map[string]string{}
	for _, l := range f.Shown {
		if o, ok := seen[l.ID]; ok {
			t.Errorf("lanes %q and %q share the id %q in the feed", o, l.Key, l.ID)
		}
		seen[l.ID] = l.Key
	}
}
