package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// openStore returns the address of the Redis to use and how to stop it: the
// one named by -redis, else a redis-server started here, else miniredis.
func openStore(cfg config) (addr, name string, stop func(), err error) {
	if cfg.Redis != "" {
		return cfg.Redis, "the Redis at " + cfg.Redis, func() {}, nil
	}
	if !cfg.MiniRedis {
		if _, err := exec.LookPath("redis-server"); err == nil {
			addr, stop, err := startRedisServer()
			if err != nil {
				return "", "", nil, err
			}
			return addr, "a redis-server started on " + addr, stop, nil
		}
	}
	m, err := miniredis.Run()
	if err != nil {
		return "", "", nil, fmt.Errorf("starting miniredis: %w", err)
	}
	name = "miniredis, in this process"
	if !cfg.MiniRedis {
		name += " (redis-server is not installed: apt-get install redis-server)"
	}
	return m.Addr(), name, m.Close, nil
}

// startRedisServer runs redis-server on a free loopback port without
// persistence, and waits until it answers. The free port is found by
// binding and releasing it; another process may take it in between, so a
// failed start is retried on a new port.
func startRedisServer() (string, func(), error) {
	var err error
	for range 5 {
		var addr string
		var stop func()
		if addr, stop, err = tryRedisServer(); err == nil {
			return addr, stop, nil
		}
	}
	return "", nil, err
}

func tryRedisServer() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--logfile", "")
	// On Linux the kernel kills the server if this program dies without
	// stopping it (SIGKILL, a test binary's timeout).
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		// The answer must come from this server: if another process took
		// the port, this one exits (below), but the other may answer first.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		pid, err := serverPID(ctx, rdb)
		cancel()
		if err == nil && pid == cmd.Process.Pid {
			return addr, stop, nil
		}
		select {
		case <-exited:
			return "", nil, errors.New("redis-server exited at start (is the port taken?)")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer: %v", addr, err)
		}
	}
}

// serverPID returns the process id of the Redis behind rdb.
func serverPID(ctx context.Context, rdb *redis.Client) (int, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("no process_id in INFO server")
}
