package sluice

import (
	"bytes"
	"io"
)

// peekLimit is the most of a body sluice reads ahead to look for a signal
// the server put there (see peek): error bodies that say "slow down" say
// so in their first lines.
const peekLimit = 4 << 10

// peek reads up to peekLimit bytes of rc ahead and returns them, with a body
// that gives the caller, byte for byte, what rc would have: the bytes read
// ahead, then the rest of rc, then rc's own error (io.EOF, or the error that
// cut the look short, at the point where rc returned it). Its Close is
// rc's. It is used only for the statuses whose body may carry a signal (see
// verdict.Body): other bodies are not looked at.
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
