package sluice

import (
	"net/http"
	"strings"
)

// isStream reports whether resp streams server-sent events.
func isStream(resp *http.Response) bool {
	var ct string
	if v := resp.Header["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	return len(ct) >= len("text/event-stream") && strings.EqualFold(ct[:len("text/event-stream")], "text/event-stream")
}
