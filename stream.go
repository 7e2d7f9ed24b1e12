package sluice

import (
	"context"
	"net/http"
	"strings"
)

type holdStreamKey struct{}

// HoldStream returns a copy of ctx whose streamed responses hold their
// in-flight slot until their body is done, as other responses do.
//
// By default a response that streams (Content-Type text/event-stream, as
// LLM APIs send a completion token by token) gives its slot back when its
// headers arrive, and the time to them is its latency sample: a stream of
// minutes would otherwise hold back the lane's quick calls, and teach the
// adaptive limit a latency that starves them. Its rate token was spent
// when it was sent, as for any request. Use HoldStream where the server
// limits concurrent streams, not only their rate.
func HoldStream(ctx context.Context) context.Context {
	return context.WithValue(ctx, holdStreamKey{}, true)
}

func holdsStream(ctx context.Context) bool {
	hold, _ := ctx.Value(holdStreamKey{}).(bool)
	return hold
}

// isStream reports whether resp streams server-sent events.
func isStream(resp *http.Response) bool {
	var ct string
	if v := resp.Header["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	return len(ct) >= len("text/event-stream") && strings.EqualFold(ct[:len("text/event-stream")], "text/event-stream")
}
