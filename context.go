package sluice

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Priority orders requests that wait for the same lane. Lower values are
// served first. The zero value is Interactive; a context without a priority
// is Normal.
type Priority int

const (
	Interactive Priority = iota // a person is waiting: served first
	Normal                      // requests whose context carries no priority
	Batch                       // background work: served last

	numLevels = 3
)

// String returns "interactive", "normal", "batch", or "Priority(n)".
func (p Priority) String() string {
	switch p {
	case Interactive:
		return "interactive"
	case Normal:
		return "normal"
	case Batch:
		return "batch"
	}
	return fmt.Sprintf("Priority(%d)", int(p))
}

func (p Priority) valid() bool { return p >= Interactive && p <= Batch }

// labels are what a context says of its requests: their priority, if it
// sets one, and their tenant. They are kept under one key, so that a
// request reads both in one walk up its context's chain.
type labels struct {
	p      Priority
	hasP   bool
	tenant string
}

type labelsKey struct{}

// labelsSet is set by the first WithPriority or WithTenant in the process:
// until then no context can carry labels, and a request skips the walk.
var labelsSet atomic.Bool

// labelsOf returns the labels ctx carries.
func labelsOf(ctx context.Context) labels {
	if !labelsSet.Load() {
		return labels{}
	}
	lb, _ := ctx.Value(labelsKey{}).(labels)
	return lb
}

// withLabels returns a copy of ctx that carries lb.
func withLabels(ctx context.Context, lb labels) context.Context {
	if !labelsSet.Load() {
		labelsSet.Store(true)
	}
	return context.WithValue(ctx, labelsKey{}, lb)
}

// priority returns the priority the labels set, or Normal when they set
// none (or one that is not a defined level).
func (lb labels) priority() Priority {
	if lb.hasP && lb.p.valid() {
		return lb.p
	}
	return Normal
}

// WithPriority returns a copy of ctx that carries p. Requests made with the
// returned context wait at that level. A priority outside Interactive..Batch
// is stored as given and read back by PriorityFrom as Normal.
func WithPriority(ctx context.Context, p Priority) context.Context {
	lb := labelsOf(ctx)
	lb.p, lb.hasP = p, true
	return withLabels(ctx, lb)
}

// PriorityFrom returns the priority carried by ctx, or Normal when it carries
// none (or one that is not a defined level).
func PriorityFrom(ctx context.Context) Priority { return labelsOf(ctx).priority() }

// WithTenant returns a copy of ctx that carries a tenant id: whose work the
// requests made with it are, for example the customer a service calls the
// upstream on behalf of. Within a priority level, tenants take turns at a
// lane's gate, and WithTenantShare caps what one tenant holds in flight.
// Requests without a tenant share one anonymous tenant (the empty id).
func WithTenant(ctx context.Context, id string) context.Context {
	lb := labelsOf(ctx)
	lb.tenant = id
	return withLabels(ctx, lb)
}

// TenantFrom returns the tenant id carried by ctx, or "" (the anonymous
// tenant) when it carries none.
func TenantFrom(ctx context.Context) string { return labelsOf(ctx).tenant }

type holdStreamKey struct{}

// HoldStream returns a copy of ctx whose streamed responses hold their
// in-flight slot until their body is done, as other responses do.
//
// By default a response that streams (Content-Type text/event-stream, as
// LLM APIs send a completion token by token) gives its slot back when its
// first event is read, and the time to it is its latency sample: a stream
// of minutes would otherwise hold back the lane's quick calls, and teach
// the adaptive limit a latency that starves them. (A first event that
// says the server is overloaded cuts the limit while its slot is still
// counted, as an overload's status does.) Its rate token was spent
// when it was sent, as for any request. Use HoldStream where the server
// limits concurrent streams, not only their rate: its refusals of more
// streams (an overload, a 429) then cut the lane's in-flight limit, and
// WithConcurrency's maximum bounds what is in flight. A held stream that
// outlasts the lane's other calls by far is counted beside the limit
// that their latency sizes, so that they keep their places. A held stream
// whose first event says it was refused gives its slot back at that event,
// as a refusal's status does.
func HoldStream(ctx context.Context) context.Context {
	return context.WithValue(ctx, holdStreamKey{}, true)
}

func holdsStream(ctx context.Context) bool {
	hold, _ := ctx.Value(holdStreamKey{}).(bool)
	return hold
}

type costKey struct{}

// A cost is one entry of the costs a context carries, newest first.
type cost struct {
	name string
	n    float64
	next *cost
}

// WithCost returns a copy of ctx whose requests cost n units of the budget
// named name (see WithBudget), for example the prompt's tokens plus
// max_tokens. Costs of several budgets accumulate; a later cost of the same
// budget replaces an earlier one. A cost of a budget the lane does not have
// is ignored. Every attempt, retries included, pays its cost. n must not be
// negative; a negative n is taken as 0.
func WithCost(ctx context.Context, name string, n int) context.Context {
	next, _ := ctx.Value(costKey{}).(*cost)
	return context.WithValue(ctx, costKey{}, &cost{name, float64(max(n, 0)), next})
}

// CostFrom returns the cost of the budget named name that ctx carries, or 0.
func CostFrom(ctx context.Context, name string) int {
	for c, _ := ctx.Value(costKey{}).(*cost); c != nil; c = c.next {
		if c.name == name {
			return int(c.n)
		}
	}
	return 0
}
