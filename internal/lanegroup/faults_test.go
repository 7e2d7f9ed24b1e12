package lanegroup

import (
	"fmt"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice"
)

// TestCapCountsOtherSubLabels: a cap of n labels holds n labels and Other,
// whatever sub-limits the lanes name: a host's "<host>/other", which its
// sub-limits share past the sub-limits' half, counts against the cap, and
// past the cap they are Other's. Outside it, n hosts made up to 2n+2.
func TestCapCountsOtherSubLabels(t *testing.T) {
	const max = 4
	g := New(nil, max)
	// The hosts are seen first; later their responses name sub-limits.
	var hosts, lanes []sluice.LaneStats
	for h := range max {
		host := fmt.Sprintf("h%d.example.com", h)
		hosts = append(hosts, lane(host, 1, 0, 0))
		sub := lane(host, 1, 0, 0)
		sub.Sublimit = "bucket"
		lanes = append(lanes, lane(host, 1, 0, 0), sub)
	}
	groups(g, sluice.Stats{Lanes: hosts})
	gs := groups(g, sluice.Stats{Lanes: lanes})
	var labels []string
	for _, gr := range gs {
		labels = append(labels, gr.Label)
	}
	if len(gs) > max+1 {
		t.Errorf("%d labels with a cap of %d: %q", len(gs), max, labels)
	}
}

// TestLabelsAreValidUTF8: a key that is not valid UTF-8 (a Host of
// "%ff.example.com" parses to one) is labelled in valid UTF-8, which an
// exporter requires.
func TestLabelsAreValidUTF8(t *testing.T) {
	g := New(nil, 0)
	if l := g.Label("\xff.example.com"); !utf8.ValidString(l) {
		t.Errorf("label %q of a key that is not valid UTF-8", l)
	}
}

// TestLabelDuringCollection: Label, which an Observer calls for each
// event, does not wait for a collection's call of Transport.Stats, which
// visits every lane (here one that does not return until Label has).
func TestLabelDuringCollection(t *testing.T) {
	g := New(nil, 0)
	inStats, labelled := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Groups(func() sluice.Stats {
			close(inStats)
			select {
			case <-labelled:
			case <-time.After(10 * time.Second):
			}
			return sluice.Stats{}
		})
	}()
	<-inStats
	start := time.Now()
	g.Label("api.example.com")
	close(labelled)
	<-done
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Label waited %v for the collection's Stats", d)
	}
}
