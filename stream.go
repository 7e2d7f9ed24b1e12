package sluice

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
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
	rc   io.ReadCloser
	t    *Transport
	l    *lane
	ctx  context.Context
	p    Priority
	sent time.Duration
	// host is the host's lane, and hostSent when the attempt was sent on
	// its clock: an overload is the host's (see Transport.read).
	host     *lane
	hostSent time.Duration
	// sub is the sub-limit the attempt drew on, if any, and subSent when
	// it was sent on its clock: its pace counts the acceptance at the
	// first event (see lane.streamServed).
	sub     *lane
	subSent time.Duration
	first   []byte // the stream's bytes so far, up to the first event's end
	// first[at:] is the block after those with no data (see firstEvent);
	// first[:from] has no blank line after at.
	at, from int
	done     bool
	kind     verdict.Kind // what the first event said, once done
	// slot is the body whose hold goes back at the first event, as what
	// that event said; nil once it went back. A stream held (HoldStream)
	// keeps it to its end if the event says it is served.
	slot *body
	held bool
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
	w.first = append(w.first, b[:min(len(b), firstFrameLimit-len(w.first))]...)
	ev, whole := w.firstEvent()
	if !whole && !end && len(w.first) < firstFrameLimit {
		return
	}
	w.done, w.first = true, nil
	if w.kind = frameKind(ev); w.kind != verdict.Served {
		// Its lane may have been forgotten since the headers, and the
		// event is then the live lane's. The stream's slot is still held
		// (see slot): an overload is read beside the attempts in flight
		// with it, as an overload's status is.
		l, sent := w.l, w.sent
		if w.kind == verdict.Overloaded && w.host != nil {
			l, sent = w.host, w.hostSent
		}
		// The slot is the host lane's (a sub-limit's hold ends with the
		// headers), and a lane that took the forgotten one's place does
		// not count it.
		for counted := l == w.host; !l.streamFailed(w.ctx, w.kind, sent, w.p, counted); counted = false {
			l, sent = w.t.relaneAt(l, sent)
		}
	} else if l, sent := w.sub, w.subSent; l != nil {
		for !l.streamServed(sent) {
			l, sent = w.t.relaneAt(l, sent)
		}
	}
	w.sub = nil
	if b := w.slot; b != nil {
		w.slot = nil
		if w.held && w.kind == verdict.Served {
			return
		}
		if h := b.take(); h != nil {
			h.Done(w.kind)
		}
	}
}

// firstEvent returns the first event in the stream's bytes so far, and
// whether it is whole (a blank line ended it). A block of lines with no
// data field, such as a comment a gateway sends while the model starts,
// is no event (see the HTML standard's "Interpreting an event stream"): it
// is passed over.
func (w *frameWatch) firstEvent() (ev []byte, whole bool) {
	for {
		end, next := blankLine(w.first, w.from)
		if end < 0 {
			// A blank line's two line ends may straddle reads.
			w.from = max(len(w.first)-1, w.at)
			return w.first[w.at:], false
		}
		if ev := w.first[w.at:end]; hasData(ev) {
			return ev, true
		}
		w.at, w.from = next, next
	}
}

// blankLine finds the first blank line in b at or after from, where an
// event ends: two line ends in a row, each a CR, an LF or a CRLF. It
// returns where the first line end begins and where the next block
// begins; -1, -1 if there is none. A CRLF's LF that has not come yet is
// read as a blank line of its own, which ends no event (see hasData).
func blankLine(b []byte, from int) (end, next int) {
	for i := from; i+1 < len(b); i++ {
		c, d := b[i], b[i+1]
		// LF then any line end, or CR then CR: a CR then an LF is one.
		if c == '\n' && (d == '\n' || d == '\r') || c == '\r' && d == '\r' {
			next = i + 2
			if d == '\r' && next < len(b) && b[next] == '\n' {
				next++
			}
			return i, next
		}
	}
	return -1, -1
}

// sseLines calls yield with each line of an event, split at CR, LF or CRLF
// as the event stream format has it, with a byte order mark dropped.
func sseLines(ev []byte, yield func(line []byte)) {
	ev = bytes.TrimPrefix(ev, []byte("\uFEFF"))
	for len(ev) > 0 {
		i := bytes.IndexAny(ev, "\r\n")
		if i < 0 {
			yield(ev)
			return
		}
		yield(ev[:i])
		if ev[i] == '\r' && i+1 < len(ev) && ev[i+1] == '\n' {
			i++
		}
		ev = ev[i+1:]
	}
}

// field returns the name and value of an event's line ("name: value"),
// with the one space the format allows after the colon dropped.
func field(line []byte) (name, value []byte) {
	name, value, _ = bytes.Cut(line, []byte(":"))
	return name, bytes.TrimPrefix(value, []byte(" "))
}

// hasData reports whether a block of lines has a data field: only then is
// it an event.
func hasData(ev []byte) bool {
	found := false
	sseLines(ev, func(line []byte) {
		if name, _ := field(line); string(name) == "data" {
			found = true
		}
	})
	return found
}

// frameKind returns what a stream's first event says: Throttled for an
// error about a rate limit, Overloaded for one about overload, else
// Served. An error is an `event: error` frame (Anthropic's, OpenAI's
// Responses API), or a data object with a top-level "error" member, which
// OpenAI-compatible servers (vLLM, SGLang, LiteLLM, OpenRouter) send with
// no event name and openai-go reads as a failed stream.
func frameKind(ev []byte) verdict.Kind {
	isError := false
	var data []byte
	sseLines(ev, func(line []byte) {
		switch name, v := field(line); string(name) {
		case "event":
			isError = string(bytes.TrimSpace(v)) == "error"
		case "data":
			data = append(append(data, v...), '\n')
		}
	})
	if !isError {
		var obj struct {
			Error json.RawMessage `json:"error"`
		}
		if d := bytes.TrimSpace(data); len(d) == 0 || d[0] != '{' || json.Unmarshal(d, &obj) != nil ||
			len(obj.Error) == 0 || string(obj.Error) == "null" {
			return verdict.Served
		}
		data = obj.Error
	}
	return errorKind(data)
}

// errorKind returns what an error's text says: its words, then the HTTP
// status its "code" or "status" member states (vLLM's and OpenRouter's
// errors carry the status the server would have answered with).
func errorKind(data []byte) verdict.Kind {
	d := bytes.ToLower(data)
	switch {
	case bytes.Contains(d, []byte("rate_limit")), bytes.Contains(d, []byte("rate limit")),
		bytes.Contains(d, []byte("ratelimit")), bytes.Contains(d, []byte("too_many_requests")):
		return verdict.Throttled
	case bytes.Contains(d, []byte("overloaded")):
		return verdict.Overloaded
	}
	var e struct {
		Error        *json.RawMessage `json:"error"` // Anthropic's and OpenAI's frames nest it
		Code, Status json.RawMessage
	}
	if json.Unmarshal(data, &e) != nil {
		return verdict.Served
	}
	if e.Error != nil && len(e.Code) == 0 && len(e.Status) == 0 {
		json.Unmarshal(*e.Error, &e)
	}
	for _, c := range []json.RawMessage{e.Code, e.Status} {
		if k := verdict.Of(statusCode(c)); k == verdict.Throttled || k == verdict.Overloaded {
			return k
		}
	}
	return verdict.Served
}

// statusCode returns the HTTP status a JSON value states, as a number or
// a string; 0 if it states none.
func statusCode(v json.RawMessage) int {
	n, err := strconv.Atoi(string(bytes.Trim(v, `"`)))
	if err != nil || n < 100 || n > 599 {
		return 0
	}
	return n
}
