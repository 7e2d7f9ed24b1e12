package sluice

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// isStream reports whether resp streams server-sent events.
func isStream(resp *http.Response) bool {
	var ct string
	if v := resp.Header["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	return len(ct) >= len("text/event-stream") && strings.EqualFold(ct[:len("text/event-stream")], "text/event-stream")
}

// firstFrameLimit is the most of a stream sluice looks at for its first
// event: an error frame comes first, and is short.
const firstFrameLimit = 4 << 10

// frameWatch is a stream's body that looks, as the caller reads it, at the
// first event: an `event: error` frame that says the client is rate-limited
// or the server overloaded (as Anthropic and OpenAI-compatible gateways
// send after a 200's headers) is fed back to the lane as a refusal or an
// overload (see lane.streamFailed). It changes nothing the caller reads,
// and looks at nothing past the first event.
type frameWatch struct {
	rc    io.ReadCloser
	t     *Transport
	l     *lane
	ctx   context.Context
	p     Priority
	sent  time.Duration
	first []byte // the stream's bytes so far, up to the first event's end
	done  bool
}

func (w *frameWatch) Read(b []byte) (int, error) {
	n, err := w.rc.Read(b)
	if !w.done {
		w.see(b[:n], err != nil)
	}
	return n, err
}

func (w *frameWatch) Close() error { return w.rc.Close() }

// see takes bytes the caller read; end says the stream ended or failed.
func (w *frameWatch) see(b []byte, end bool) {
	// A separator may straddle reads: look again from three bytes back.
	from := max(len(w.first)-3, 0)
	w.first = append(w.first, b[:min(len(b), firstFrameLimit-len(w.first))]...)
	ev, whole := firstEvent(w.first, from)
	if !whole && !end && len(w.first) < firstFrameLimit {
		return
	}
	w.done, w.first = true, nil
	if k := frameKind(ev); k != verdict.Served {
		// The stream's slot went back with its headers: its lane may have
		// been forgotten since, and the event is then the live lane's.
		for l, sent := w.l, w.sent; !l.streamFailed(w.ctx, k, sent, w.p); {
			l, sent = w.t.relaneAt(l, sent)
		}
	}
}

// firstEvent returns the first event of an SSE stream that begins with b,
// and whether it is whole (a blank line ended it); b[:from] holds no blank
// line.
func firstEvent(b []byte, from int) (ev []byte, whole bool) {
	end := -1
	for _, sep := range [...]string{"\n\n", "\r\n\r\n", "\r\r"} {
		if i := bytes.Index(b[from:], []byte(sep)); i >= 0 && (end < 0 || from+i < end) {
			end = from + i
		}
	}
	if end < 0 {
		return b, false
	}
	return b[:end], true
}

// frameKind returns what a stream's first event says: Throttled for an
// error event about a rate limit, Overloaded for one about overload, else
// Served.
func frameKind(ev []byte) verdict.Kind {
	isError := false
	var data []byte
	for line := range bytes.Lines(ev) {
		line = bytes.TrimRight(line, "\r\n")
		if v, ok := bytes.CutPrefix(line, []byte("event:")); ok {
			isError = string(bytes.TrimSpace(v)) == "error"
		} else if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = append(data, v...)
		}
	}
	if !isError {
		return verdict.Served
	}
	d := bytes.ToLower(data)
	switch {
	case bytes.Contains(d, []byte("rate_limit")), bytes.Contains(d, []byte("rate limit")),
		bytes.Contains(d, []byte("too_many_requests")):
		return verdict.Throttled
	case bytes.Contains(d, []byte("overloaded")):
		return verdict.Overloaded
	}
	return verdict.Served
}
