package sluiceotel

import (
	"net"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice/internal/lanegroup"
)

// Attribute keys of sluice's own; the rest are the semantic conventions'.
const (
	LaneKey     = attribute.Key("sluice.lane")      // a lane whose name is not a host
	PriorityKey = attribute.Key("sluice.priority")  // interactive, normal, batch
	AttemptKey  = attribute.Key("sluice.attempt")   // 1 for a first attempt
	WaitKey     = attribute.Key("sluice.wait_time") // seconds: waited, estimated or to wait
	QueuedKey   = attribute.Key("sluice.queued")    // the lane's queue length
	CauseKey    = attribute.Key("sluice.cause")     // of a cooldown, a rate change or an overload
	RateFromKey = attribute.Key("sluice.rate.from")
	RateToKey   = attribute.Key("sluice.rate.to")
	LimitKey    = attribute.Key("sluice.in_flight.limit") // the in-flight limit an overload left
)

// laneAttrs returns the attributes of a lane name: server.address (and
// server.port) when it is a host, as the default lane key is, and
// sluice.lane otherwise.
func laneAttrs(name string) []attribute.KeyValue {
	if name == lanegroup.Other {
		return []attribute.KeyValue{LaneKey.String(name)}
	}
	host, port := name, ""
	if h, p, err := net.SplitHostPort(name); err == nil {
		host, port = h, p
	}
	if !isHost(host) {
		return []attribute.KeyValue{LaneKey.String(name)}
	}
	kv := []attribute.KeyValue{semconv.ServerAddress(host)}
	if port != "" {
		// Only a port written as a number is written (no sign, no leading
		// zero): lanes "host:80" and "host:080" are two, and would
		// otherwise share their attributes.
		n, err := strconv.Atoi(port)
		if err != nil || n < 0 || n > 65535 || strconv.Itoa(n) != port {
			return []attribute.KeyValue{LaneKey.String(name)}
		}
		kv = append(kv, semconv.ServerPort(n))
	}
	return kv
}

// isHost reports whether s reads as a host name with a dot, localhost or an
// IP address: a key such as "openai" (see sluice.WithKey) names a lane,
// not a server.
func isHost(s string) bool {
	if net.ParseIP(s) != nil || s == "localhost" {
		return true
	}
	if !strings.Contains(s, ".") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}
