//go:build !linux

package main

import "syscall"

// sysProcAttr is nil where the kernel cannot kill a redis-server when the
// process that started it dies.
func sysProcAttr() *syscall.SysProcAttr { return nil }
