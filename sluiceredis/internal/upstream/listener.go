package upstream

import (
	"context"
	"net"
	"sync"
)

// pipeListener is an in-memory [net.Listener] whose connections are
// [net.Pipe] pairs. It needs no sockets, so it works inside a
// testing/synctest bubble, where loopback TCP does not.
//
// Every connection end it creates (server and client side) is tracked
// until closed, so that Close can tear down all of them and let every
// goroutine reading or writing them exit.
type pipeListener struct {
	addr  pipeAddr
	conns chan net.Conn // server ends, handed from Dial to Accept
	done  chan struct{} // closed by Close

	mu     sync.Mutex
	closed bool
	open   map[*pipeConn]struct{}
}

// newPipeListener returns a listener whose Addr reports host. Inside a
// bubble it must be created inside that bubble (its channels belong to it).
func newPipeListener(host string) *pipeListener {
	return &pipeListener{
		addr:  pipeAddr(host),
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
		open:  make(map[*pipeConn]struct{}),
	}
}

// Accept waits for the next Dial and returns the server end of its pipe.
// After Close it returns [net.ErrClosed].
func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: l.addr.Network(), Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops Accept and Dial and closes every connection the listener
// created that is still open, on both ends. It is idempotent.
func (l *pipeListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	open := make([]*pipeConn, 0, len(l.open))
	for c := range l.open {
		open = append(open, c)
	}
	l.mu.Unlock()

	for _, c := range open {
		c.Close()
	}
	return nil
}

// Addr returns the listener's fake address.
func (l *pipeListener) Addr() net.Addr { return l.addr }

// Dial creates a connected pipe pair, hands the server end to Accept and
// returns the client end. It blocks until Accept takes the connection,
// ctx is done, or the listener is closed. network and addr are ignored:
// every dial reaches this listener.
func (l *pipeListener) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	s, c := net.Pipe()
	srv := &pipeConn{Conn: s, l: l}
	cli := &pipeConn{Conn: c, l: l}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		s.Close()
		c.Close()
		return nil, l.dialErr(net.ErrClosed)
	}
	l.open[srv] = struct{}{}
	l.open[cli] = struct{}{}
	l.mu.Unlock()

	select {
	case l.conns <- srv:
		return cli, nil
	case <-l.done:
		srv.Close()
		cli.Close()
		return nil, l.dialErr(net.ErrClosed)
	case <-ctx.Done():
		srv.Close()
		cli.Close()
		return nil, l.dialErr(ctx.Err())
	}
}

func (l *pipeListener) dialErr(err error) error {
	return &net.OpError{Op: "dial", Net: l.addr.Network(), Addr: l.addr, Err: err}
}

// forget removes c from the set of open connections.
func (l *pipeListener) forget(c *pipeConn) {
	l.mu.Lock()
	delete(l.open, c)
	l.mu.Unlock()
}

// pipeConn is one end of a pipe created by a pipeListener. It reports the
// listener's address on both sides and unregisters itself when closed.
type pipeConn struct {
	net.Conn
	l    *pipeListener
	once sync.Once
}

// Close closes the pipe end and removes it from the listener's tracking.
func (c *pipeConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.forget(c) })
	return err
}

// LocalAddr returns the listener's address.
func (c *pipeConn) LocalAddr() net.Addr { return c.l.addr }

// RemoteAddr returns the listener's address.
func (c *pipeConn) RemoteAddr() net.Addr { return c.l.addr }

// pipeAddr is the address of a pipeListener: network "pipe", and a
// host:port string used to build the server URL.
type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }
