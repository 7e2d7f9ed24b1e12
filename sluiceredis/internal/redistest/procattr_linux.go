package redistest

import "syscall"

// sysProcAttr has the kernel kill a server when the process that started
// it dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
