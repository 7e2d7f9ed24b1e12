//go:build !linux

package sluiceredis

import "syscall"

// childProcAttr is nil where the kernel cannot kill a child when its parent
// dies.
func childProcAttr() *syscall.SysProcAttr { return nil }
