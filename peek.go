package sluice

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// peekLimit is the most of a body sluice reads ahead to look for a signal
// the server put there (see peek): error bodies that say "slow down" say
// so in their first lines.
const peekLimit = 4 << 10

// peekWait is how long RoundTrip waits for the part of a body it looks at:
// an error body comes with its headers, and a server that holds back the
// rest of a body cannot hold back the response.
const peekWait = 100 * time.Millisecond

// peek reads up to peekLimit bytes of rc ahead, for at most peekWait, and
// returns them (nil if they did not all come in time: the body is then
// not looked at), with a body that gives the caller, byte for byte, what
// rc would have: the bytes read ahead, then the rest of rc, then rc's own
// error (io.EOF, or the error that cut the look short, at the point where
// rc returned it). Its Close is rc's; it does not wait for a read in
// progress, which Close cuts short, and a Read after it is rc's too (an
// error, as net/http's bodies give), not the bytes read ahead. It is used
// only for the bodies that may carry a signal (see looksAt): other bodies
// are not looked at.
func peek(rc io.ReadCloser) ([]byte, io.ReadCloser) {
	p := &peeked{rc: rc, buf: make([]byte, 0, 512)}
	p.more = sync.NewCond(&p.mu)
	done := make(chan struct{})
	go p.fill(done)
	timer := time.NewTimer(peekWait)
	defer timer.Stop()
	select {
	case <-done:
		return p.buf, p
	case <-timer.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filled {
		return p.buf, p // came as the wait ended
	}
	p.handed = true // the read in progress is the last the look makes
	return nil, p
}

// peeked is a body whose first bytes are read ahead (see peek).
type peeked struct {
	rc io.ReadCloser

	mu     sync.Mutex
	more   *sync.Cond // fill read more, or stopped
	buf    []byte     // read ahead and not yet read by the caller
	err    error      // what rc returned when the look stopped; nil: rc has more
	filled bool       // the look stopped: what rc has next is the caller's to read
	handed bool       // peek stopped waiting: the look stops at its next read's end
	closed bool       // Close was called: reads are rc's, once the look stopped
}

// fill reads ahead until peekLimit, rc's end or error, or (once peek
// stopped waiting) the end of the read in progress. A reader that returns
// nothing and no error is asked a few times, then left for the caller.
func (p *peeked) fill(done chan<- struct{}) {
	defer close(done)
	var chunk []byte
	for empty := 0; ; {
		p.mu.Lock()
		n := len(p.buf)
		stop := n >= peekLimit || p.err != nil || empty >= 8 || p.handed
		if stop {
			p.filled = true
			p.more.Broadcast()
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if chunk == nil {
			chunk = make([]byte, 512)
		}
		m, err := p.rc.Read(chunk[:min(len(chunk), peekLimit-n)])
		p.mu.Lock()
		p.buf = append(p.buf, chunk[:m]...)
		p.err = err
		p.more.Broadcast()
		p.mu.Unlock()
		if m == 0 {
			empty++
		}
	}
}

func (p *peeked) Read(b []byte) (int, error) {
	p.mu.Lock()
	for !p.filled && (p.closed || len(p.buf) == 0 && p.err == nil) {
		p.more.Wait()
	}
	if p.closed {
		// What rc gives after its Close, not what was read ahead.
		p.mu.Unlock()
		return p.rc.Read(b)
	}
	if len(p.buf) > 0 {
		n := copy(b, p.buf)
		p.buf = p.buf[n:]
		p.mu.Unlock()
		return n, nil
	}
	err := p.err
	p.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return p.rc.Read(b)
}

func (p *peeked) Close() error {
	p.mu.Lock()
	p.closed, p.handed = true, true // the look stops at the end of its read
	p.mu.Unlock()
	return p.rc.Close()
}

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
