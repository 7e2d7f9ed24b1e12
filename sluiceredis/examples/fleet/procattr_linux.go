package main

import "syscall"

// sysProcAttr has the kernel kill a redis-server started here when this
// program dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
