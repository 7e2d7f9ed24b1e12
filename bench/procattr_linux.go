package main

import "syscall"

// sysProcAttr has the kernel kill a redis-server when the process that
// started it dies, even by SIGKILL.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
