//go:build !linux

package sluice

import (
	"runtime"
	"time"
)

// preciseSleep yields the processor once: without a precise sleep of the
// system's, the dispatcher waits for sub-millisecond tokens by yielding.
func preciseSleep(time.Duration) { runtime.Gosched() }
