// Package redistest runs a throwaway redis-server for tests and examples.
//
// Tests need a real Redis: the backend's Lua script, server TIME, key
// expiry and what happens when the server dies or stalls are the things
// under test, and a fake would only test the fake. Without the binary a test
// skips, telling how to install it; with SLUICE_REQUIRE_REDIS=1 (set by
// .ci/run) the skip becomes a failure, so CI cannot pass by skipping.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binary is the server program looked up in PATH.
const Binary = "redis-server"

// Missing returns a non-nil error when redis-server cannot be run here.
func Missing() error {
	if _, err := exec.LookPath(Binary); err != nil {
		return fmt.Errorf("%s not found in PATH (apt-get install redis-server): %w", Binary, err)
	}
	return nil
}

// Require skips t when redis-server is missing, or fails it when
// SLUICE_REQUIRE_REDIS=1.
func Require(t testing.TB) {
	t.Helper()
	if err := Missing(); err != nil {
		if os.Getenv("SLUICE_REQUIRE_REDIS") == "1" {
			t.Fatalf("SLUICE_REQUIRE_REDIS=1 but %v", err)
		}
		t.Skipf("skipping: %v", err)
	}
}

// A Server is a redis-server process on a loopback port. Its methods are
// safe for concurrent use.
type Server struct {
	port int

	args []string // more arguments for redis-server (see StartServerArgs)

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd has been reaped
}

// Start starts a redis-server for t on a free port (Require's skip rules
// apply) and stops it in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	s, err := StartServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServer starts a redis-server on a free loopback port, with no
// persistence, and waits until it answers PING. The caller must Stop it.
func StartServer() (*Server, error) {
	return StartServerArgs()
}

// StartServerArgs is StartServer with more arguments for redis-server
// (such as "--cluster-enabled", "yes").
func StartServerArgs(args ...string) (*Server, error) {
	if err := Missing(); err != nil {
		return nil, err
	}
	var last error
	// The free port is found by binding and releasing it; another process
	// may take it in between, so a failed start is retried on a new port.
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{port: port, args: args}
		if last = s.Restart(); last == nil {
			return s, nil
		}
	}
	return nil, last
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Restart starts the server again on the same port after Stop (with empty
// data, as a crashed Redis without persistence comes back), and waits until
// it answers PING. It does nothing if the server is running.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(Binary,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--logfile", "")
	cmd.Args = append(cmd.Args, s.args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	// On Linux, the kernel kills the server when the test binary dies, even
	// by SIGKILL (a go test -timeout, a CI job cancelled), where no Cleanup
	// runs. (Strictly, when the OS thread that started it exits; the Go
	// runtime keeps its threads unless a goroutine locked to one exits.)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting %s: %w", Binary, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The answer must come from this server: if another process took
		// the port first, this one fails to bind and exits (below), but the
		// other may answer PING in the meantime.
		if pid, err := serverPID(s.Addr()); err == nil && pid == cmd.Process.Pid {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redistest: %s on port %d exited: %v", Binary, s.port, waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redistest: %s on port %d did not answer PING within 10s", Binary, s.port)
		}
	}
}

// Stop kills the server (SIGKILL: as abrupt as a crash) and waits until it
// has exited, so that its port refuses connections. It does nothing if the server is stopped.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies only once continued
	<-s.exited                                // reaped: its port is closed
	s.cmd, s.exited = nil, nil
}

// Pause stops the server process (SIGSTOP) without closing its sockets: a
// stalled Redis, which accepts connections and never answers.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server is stopped")
	}
	return s.cmd.Process.Signal(sig)
}

// serverPID asks the server at addr for its process id (INFO server),
// without a client library, so that the helper does not depend on the code
// under test.
func serverPID(addr string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	line = strings.TrimSpace(line)
	n, err := strconv.Atoi(strings.TrimPrefix(line, "$"))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("redistest: INFO answered %q", line)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("redistest: no process_id in INFO server")
}
