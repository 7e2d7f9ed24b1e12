//go:build !linux

package main

import "syscall"

// sysProcAttr is nil where the kernel cannot kill a child when its parent
// dies: a redis-server started here outlives a killed program.
func sysProcAttr() *syscall.SysProcAttr { return nil }
