package headers

import (
	"net/http"
	"strings"
	"testing"
)

func TestLimitName(t *testing.T) {
	for _, c := range []struct {
		name   string
		kv     []string
		want   string
		global bool
	}{
		{"github", []string{"X-RateLimit-Resource", "search", "X-RateLimit-Remaining", "0"}, "search", false},
		{"discord bucket", []string{"X-RateLimit-Bucket", "abcd1234cd1234ef", "X-RateLimit-Scope", "user"}, "abcd1234cd1234ef", false},
		{"discord global", []string{"X-RateLimit-Global", "true", "X-RateLimit-Scope", "global"}, "", true},
		{"discord global scope only", []string{"X-RateLimit-Scope", "global", "X-RateLimit-Bucket", "b"}, "", true},
		{"discord shared", []string{"X-RateLimit-Scope", "shared", "X-RateLimit-Bucket", "b"}, "b", false},
		{"global false", []string{"X-RateLimit-Global", "false", "X-RateLimit-Bucket", "b"}, "b", false},
		{"ietf one policy", []string{"RateLimit", `"search";r=3;t=20`}, "", false},
		{"ietf two policies", []string{"RateLimit", `"burst";r=3;t=20, "daily";r=900;t=3600`}, "", false},
		{"draft07 dictionary", []string{"RateLimit", "limit=100, remaining=50, reset=30"}, "", false},
		{"too long", []string{"X-RateLimit-Bucket", strings.Repeat("b", MaxLimitName+1)}, "", false},
		{"control byte", []string{"X-RateLimit-Resource", "co\x01re"}, "", false},
		{"space", []string{"X-RateLimit-Resource", "co re"}, "", false},
		{"none", []string{"X-RateLimit-Remaining", "3"}, "", false},
	} {
		h := http.Header{}
		for i := 0; i < len(c.kv); i += 2 {
			h.Add(c.kv[i], c.kv[i+1])
		}
		name, bucket, global := LimitName(h)
		if name != c.want || global != c.global || bucket != (name != "" && h.Get("X-RateLimit-Resource") == "") {
			t.Errorf("%s: LimitName = %q, %v, %v; want %q, global %v", c.name, name, bucket, global, c.want, c.global)
		}
	}
}

// FuzzLimitName: any header values give a name within the bounds, or none.
func FuzzLimitName(f *testing.F) {
	for _, s := range [][4]string{
		{"core", "", "", ""},
		{"", "41f9a2", "", "user"},
		{"", "", "true", "global"},
		{"", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], `"burst";r=1;t=2`)
	}
	f.Fuzz(func(t *testing.T, resource, bucket, global, scope, rl string) {
		h := http.Header{}
		for k, v := range map[string]string{"X-Ratelimit-Resource": resource, "X-Ratelimit-Bucket": bucket,
			"X-Ratelimit-Global": global, "X-Ratelimit-Scope": scope, "Ratelimit": rl} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		name, isBucket, g := LimitName(h)
		if (g && name != "") || (isBucket && name == "") {
			t.Fatalf("LimitName = %q, %v, %v", name, isBucket, g)
		}
		if name != "" && !validName(name) {
			t.Fatalf("LimitName = %q: not a valid name", name)
		}
	})
}
