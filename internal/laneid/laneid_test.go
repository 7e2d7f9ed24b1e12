package laneid

import "testing"

// Names collide where IDs do not: a lane keyed "a/b" and sub-limit "b" of
// lane "a"; keys that differ only where the key ends.
func TestStringsDiffer(t *testing.T) {
	ids := []ID{{"a/b", ""}, {"a", "b"}, {"a", "b/c"}, {"a/b", "c"}, {"1:a", "b"}, {"a", ""}}
	seen := map[string]ID{}
	for _, id := range ids {
		if o, ok := seen[id.String()]; ok {
			t.Errorf("%+v and %+v both read %q", o, id, id.String())
		}
		seen[id.String()] = id
	}
	if (ID{"a", ""}).Compare(ID{"a", "b"}) >= 0 || (ID{"a", "z"}).Compare(ID{"b", ""}) >= 0 {
		t.Error("a lane must come before its sub-limits, and keys first")
	}
}
