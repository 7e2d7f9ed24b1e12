// Package sluicestatus serves a live status page of a sluice.Transport, for
// a service to mount beside expvar or net/http/pprof:
//
//	h, err := sluicestatus.New(tr)
//	if err != nil { ... }
//	defer h.Close()
//	mux.Handle("/debug/sluice/", http.StripPrefix("/debug/sluice", h))
//
// The page shows each lane: the rate it achieves against the rate it paces
// to and its ceiling, in flight against the limit, the queue of each
// priority level with its oldest wait, the 429s and cooldowns of the last
// minutes, and charts of the rate, the queue depth and the wait p99 of each
// level over the history (10 minutes by default). It is one HTML page with
// its script and style inline and its charts drawn as SVG: no build step,
// no external asset, no request outside its own origin. The page polls the
// same handler for its figures as JSON (?format=json), which scripts may
// read too; its fields are the page's and may change.
//
// The page may show internal host names and counts: mount it where only
// operators can reach it, as with pprof.
package sluicestatus
