package sluicestatus

import (
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
