package redistest

import (
	"strings"
	"testing"
)

// TestRestartOnATakenPort: a server started on a port another redis-server
// holds must fail, not take the other's answer to PING for its own.
func TestRestartOnATakenPort(t *testing.T) {
	first := Start(t)
	second := &Server{port: first.port}
	err := second.Restart()
	if err == nil {
		second.Stop()
		t.Fatal("Restart on a port another server holds: no error")
	}
	if !strings.Contains(err.Error(), "exited") {
		t.Errorf("Restart on a taken port: %v, want the server's exit", err)
	}
	if pid, err := serverPID(first.Addr()); err != nil || pid != first.cmd.Process.Pid {
		t.Errorf("the first server: pid %d, %v; want %d", pid, err, first.cmd.Process.Pid)
	}
}
