package sluiceredis

import "syscall"

// childProcAttr has the kernel kill a child of TestFleetProcesses when the
// test binary dies, even by SIGKILL, where no cleanup runs.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
