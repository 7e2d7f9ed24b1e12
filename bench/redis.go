package main

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// redisServer is a redis-server on a loopback port, with no persistence,
// for the middleware that keeps its state in Redis.
type redisServer struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startRedis starts a redis-server on a free loopback port and waits until
// it answers PING. The free port is found by binding and releasing it;
// another process may take it in between, so a failed start is retried.
func startRedis() (*redisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH (apt-get install redis-server): %w", err)
	}
	var last error
	for range 5 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		s := &redisServer{addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
		s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--logfile", "")
		s.cmd.SysProcAttr = sysProcAttr()
		if err := s.cmd.Start(); err != nil {
			return nil, err
		}
		go func() { s.cmd.Wait(); close(s.exited) }()
		if last = s.waitPing(); last == nil {
			return s, nil
		}
		s.stop()
	}
	return nil, fmt.Errorf("starting redis-server: %w", last)
}

// waitPing waits until this server (not another process that took the
// port) answers PING with its own process id.
func (s *redisServer) waitPing() error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("redis-server on %s exited", s.addr)
		default:
		}
		if pid, err := redisPID(s.addr); err == nil && pid == s.cmd.Process.Pid {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on %s did not answer", s.addr)
}

// redisPID asks the server at addr for its process id (INFO server).
func redisPID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
}

// stop kills the server and waits for it.
func (s *redisServer) stop() {
	s.cmd.Process.Kill()
	<-s.exited
}
