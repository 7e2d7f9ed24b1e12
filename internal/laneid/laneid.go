// Package laneid tells a lane or a sub-limit apart from every other, for
// the packages that keep figures per lane (the exporters' grouping, the
// status page). sluice.LaneStats.Name cannot: it joins a lane's key and a
// sub-limit's name with "/", which a key may contain, so that lane "a/b"
// and sub-limit "b" of lane "a" share a name.
package laneid

import (
	"cmp"
	"strconv"
	"unicode/utf8"

	"github.com/sluice-go/sluice"
)

// An ID is a lane's key and, for a sub-limit, its name ("" for a lane).
// It is comparable: a map key.
type ID struct{ Key, Sub string }

// Of returns the ID of the lane or sub-limit ls reports.
func Of(ls *sluice.LaneStats) ID { return ID{ls.Key, ls.Sublimit} }

// Compare orders IDs by key, each lane before its sub-limits.
func (id ID) Compare(o ID) int {
	if c := cmp.Compare(id.Key, o.Key); c != 0 {
		return c
	}
	return cmp.Compare(id.Sub, o.Sub)
}

// String returns a text that, unlike a name, no other ID has: for a
// sub-limit the key's length, ":", the key, "/" and the name, which
// begins with a digit; for a lane its key, with ":" before it if it
// begins with a digit, ":" or '"', so that no lane reads as a sub-limit
// ("3:abc/x" is the sub-limit x of lane abc, ":3:abc/x" the lane keyed
// so). A text that would not be valid UTF-8 (a key is any bytes) is
// quoted, as strconv.Quote does, so that it begins with '"' and stays
// apart from every other once in JSON, which replaces invalid bytes.
func (id ID) String() string {
	var s string
	if id.Sub == "" {
		s = id.Key
		if k := id.Key; k != "" && (k[0] == ':' || k[0] == '"' || '0' <= k[0] && k[0] <= '9') {
			s = ":" + k
		}
	} else {
		s = strconv.Itoa(len(id.Key)) + ":" + id.Key + "/" + id.Sub
	}
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	return s
}
