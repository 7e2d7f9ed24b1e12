package sluice

import (
	"bytes"
	"io"
	"net/http"
	"strings"
)

// peekLimit is the most of a body sluice reads ahead to look for a signal
// the server put there (see peek): error bodies that say "slow down" say
// so in their first lines.
const peekLimit = 4 << 10

// peek reads up to peekLimit bytes of rc ahead and returns them, with a body
// that gives the caller, byte for byte, what rc would have: the bytes read
// ahead, then the rest of rc, then rc's own error (io.EOF, or the error that
// cut the look short, at the point where rc returned it). Its Close is
// rc's. It is used only for the bodies that may carry a signal (see
// looksAt): other bodies are not looked at.
func peek(rc io.ReadCloser) ([]byte, io.ReadCloser) {
	buf := make([]byte, 0, 512)
	var err error
	// A reader that returns nothing and no error is asked a few times,
	// then left for the caller.
	for empty := 0; len(buf) < peekLimit && err == nil && empty < 8; {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		var n int
		n, err = rc.Read(buf[len(buf):min(cap(buf), peekLimit)])
		buf = buf[:len(buf)+n]
		if n == 0 {
			empty++
		}
	}
	return buf, &peeked{r: bytes.NewReader(buf), err: err, rc: rc}
}

// peeked is a body whose first bytes were read ahead (see peek).
type peeked struct {
	r   *bytes.Reader
	err error // what rc returned when the look stopped; nil: rc has more
	rc  io.ReadCloser
}

func (p *peeked) Read(b []byte) (int, error) {
	if p.r.Len() > 0 {
		return p.r.Read(b)
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.rc.Read(b)
}

func (p *peeked) Close() error { return p.rc.Close() }

// looksAt reports whether resp's body is looked at (see peek): a 403's or
// a 429's, and the JSON answer (a 200 or a 4xx) of a GraphQL endpoint,
// whose throttles come in the body: GitHub's /graphql, Linear's, Shopify's
// graphql.json.
func looksAt(resp *http.Response) bool {
	if resp.Body == nil || resp.Body == http.NoBody {
		return false
	}
	switch s := resp.StatusCode; {
	case s == http.StatusForbidden || s == http.StatusTooManyRequests:
		return true
	case s != http.StatusOK && (s < 400 || s >= 500):
		return false
	}
	if resp.Request == nil || resp.Request.URL == nil {
		return false
	}
	p := resp.Request.URL.Path
	if n := len(p); n == 0 || p[n-1] != 'l' && p[n-1] != 'n' {
		return false // neither suffix below: most paths are ruled out by one byte
	}
	if !strings.HasSuffix(p, "/graphql") && !strings.HasSuffix(p, "/graphql.json") {
		return false
	}
	ct := resp.Header.Get("Content-Type")
	return strings.Contains(ct, "json")
}
