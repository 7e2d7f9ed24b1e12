package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrRejected is the errors.Is target for every admission refusal: a request
// that sluice declined to send because it could not be served in time.
// The error is always a *RejectedError.
var ErrRejected = errors.New("sluice: request rejected")

// ErrInvalidOption is the errors.Is target for every error New returns
// because of a bad option.
var ErrInvalidOption = errors.New("sluice: invalid option")

// Reason says why a request was refused.
type Reason int

const (
	// ReasonDeadline: the estimated wait ends after the context's
	// deadline, or, behind other waiters, leaves less than the time the
	// lane's calls take. Such an error also matches
	// context.DeadlineExceeded.
	ReasonDeadline Reason = iota
	// ReasonMaxWait: the estimated wait exceeds WithMaxWait for the level.
	ReasonMaxWait
	// ReasonQueueFull: the lane already has WithMaxQueue attempts waiting.
	// The lane is saturated.
	ReasonQueueFull
	// ReasonTenantQueue: the request's tenant already has WithTenantQueue
	// attempts waiting in the lane. That tenant is too busy; others may be
	// served.
	ReasonTenantQueue
	// ReasonCost: the request costs more of a budget than the budget holds
	// (see WithBudget and WithCost); it can never be served.
	ReasonCost

	numReasons
)

// String returns "deadline", "max-wait", "queue-full", "tenant-queue" or
// "cost".
func (r Reason) String() string {
	switch r {
	case ReasonDeadline:
		return "deadline"
	case ReasonMaxWait:
		return "max-wait"
	case ReasonQueueFull:
		return "queue-full"
	case ReasonTenantQueue:
		return "tenant-queue"
	case ReasonCost:
		return "cost"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// RejectedError is returned by RoundTrip when a request is refused before it
// is sent. The request was not sent and used no budget.
type RejectedError struct {
	Key      string   // the lane
	Sublimit string   // the lane's sub-limit that refused, if one did (see WithSublimit)
	Priority Priority // the request's level
	Reason   Reason
	// Wait is the estimated wait that was too long (for ReasonDeadline
	// behind other waiters, until the answer: the wait and the time the
	// lane's calls take); RetryAfter is when trying again is likely to be served at
	// once. Both are estimates: see Transport for how they are computed.
	Wait       time.Duration
	RetryAfter time.Duration
	Limit      time.Duration // the deadline's remaining time, or the max wait
	// Tenant is the request's tenant (see WithTenant); Queued is, for the
	// queue bounds, how many attempts were already waiting.
	Tenant string
	Queued int
	// Budget, Cost and Size are, for ReasonCost, the budget, the cost that
	// exceeds its size, and its size.
	Budget string
	Cost   int64
	Size   int64
}

// Error returns a message that starts with "sluice:" and names the
// priority, the lane's key (and sub-limit) and why the request was refused.
func (e *RejectedError) Error() string {
	key := e.Key
	if e.Sublimit != "" {
		key += "/" + e.Sublimit
	}
	switch e.Reason {
	case ReasonQueueFull:
		return fmt.Sprintf("sluice: %s request to %q rejected: %d attempts already queued", e.Priority, key, e.Queued)
	case ReasonTenantQueue:
		return fmt.Sprintf("sluice: %s request to %q rejected: tenant %q already has %d attempts queued", e.Priority, key, e.Tenant, e.Queued)
	case ReasonCost:
		return fmt.Sprintf("sluice: %s request to %q rejected: cost %d exceeds the size of budget %q, %d", e.Priority, key, e.Cost, e.Budget, e.Size)
	}
	what := "wait"
	if e.Reason == ReasonDeadline && e.RetryAfter < e.Wait {
		what = "wait and call"
	}
	return fmt.Sprintf("sluice: %s request to %q rejected: estimated %s %v exceeds %s %v",
		e.Priority, key, what, e.Wait.Round(time.Millisecond), e.Reason, e.Limit.Round(time.Millisecond))
}

// Is reports whether target is ErrRejected, or context.DeadlineExceeded for a
// refusal because of the context's deadline.
func (e *RejectedError) Is(target error) bool {
	return target == ErrRejected || (e.Reason == ReasonDeadline && target == context.DeadlineExceeded)
}

// Unwrap returns ErrRejected.
func (e *RejectedError) Unwrap() error { return ErrRejected }

// Timeout reports whether the refusal was for the context's deadline, so that
// os.IsTimeout and net.Error users see it as the timeout it stands for, as
// they would see the deadline's own error without sluice.
func (e *RejectedError) Timeout() bool { return e.Reason == ReasonDeadline }

// Temporary reports what Timeout does, as context.DeadlineExceeded's does.
// With it a RejectedError is a net.Error: errors.As finds a net.Error only
// in an error that has both methods.
func (e *RejectedError) Temporary() bool { return e.Timeout() }
