//go:build !linux

package redistest

import "syscall"

// sysProcAttr is nil where the kernel cannot kill a server when the process
// that started it dies; a killed test binary may leave one behind there.
func sysProcAttr() *syscall.SysProcAttr { return nil }
