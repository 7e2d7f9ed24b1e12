package sluiceotel

import (
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// TestLaneAttrsDistinct: lanes whose names differ get attributes that
// differ: a port is server.port only as the number it is written as.
func TestLaneAttrsDistinct(t *testing.T) {
	for _, c := range []struct {
		name string
		want []attribute.KeyValue
	}{
		{"api.test", []attribute.KeyValue{attribute.String("server.address", "api.test")}},
		{"api.test:80", []attribute.KeyValue{attribute.String("server.address", "api.test"), attribute.Int("server.port", 80)}},
		{"api.test:080", []attribute.KeyValue{LaneKey.String("api.test:080")}},
		{"api.test:+80", []attribute.KeyValue{LaneKey.String("api.test:+80")}},
		{"api.test:70000", []attribute.KeyValue{LaneKey.String("api.test:70000")}},
		{"openai", []attribute.KeyValue{LaneKey.String("openai")}},
	} {
		if got := laneAttrs(c.name); !slices.Equal(got, c.want) {
			t.Errorf("laneAttrs(%q) = %v, want %v", c.name, got, c.want)
		}
	}
}
