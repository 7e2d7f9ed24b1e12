package sluice

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sub-limits: several limits behind one host. A lane keeps the host's
// limit (WithRate, the in-flight limit, global cooldowns); a sub-limit is
// one of the limits behind it that only some requests count against
// (GitHub's search beside core, a Discord bucket, one LLM model). A
// sub-limit is a lane of its own, kept beside its host's lane under the
// key host + subSep + name, with the host's options except that it has no
// configured rate and no in-flight limit of its own (see Transport.subCfg):
// it paces by what its responses say. A request with a sub-limit takes its
// token there first, then its token and slot on the host's lane.

type sublimitKey struct{}

// sublimitsNamed is set by the first WithSublimit in the process: until
// then no context can carry a sub-limit, and requests skip the lookup.
var sublimitsNamed atomic.Bool

// WithSublimit returns a copy of ctx whose requests draw on the sub-limit
// name of their lane, besides the lane's own limit: for example the model
// an LLM API limits each model separately by, or a Slack method. The
// sub-limit paces by the rate-limit headers of its own responses and
// cools down on its own refusals, so that one exhausted sub-limit holds
// back only the requests that draw on it. Costs (WithCost) are drawn on
// the sub-limit's budgets: with WithBudget, each sub-limit has its own.
// An empty name is no sub-limit. A name longer than 64 bytes is cut to
// its first 64.
func WithSublimit(ctx context.Context, name string) context.Context {
	if !sublimitsNamed.Load() {
		sublimitsNamed.Store(true)
	}
	return context.WithValue(ctx, sublimitKey{}, name)
}

// SublimitFrom returns the sub-limit ctx names (see WithSublimit), or "".
func SublimitFrom(ctx context.Context) string {
	name, _ := ctx.Value(sublimitKey{}).(string)
	return name
}

const (
	// subSep joins a host's key and a sub-limit's name into the sub-limit
	// lane's key; Stats and events show the two apart.
	subSep = "\x00"
	// maxSublimit bounds a sub-limit's name.
	maxSublimit = 64
	// maxSublimits bounds the sub-limits of one lane, and maxRoutes the
	// routes it files under them: a server that names a new limit per
	// request, or a client that calls a new path per request, cannot grow
	// a lane without bound. A name past the cap is read as the host's
	// (counted in LaneStats.Folded); a route past it is not filed, and is
	// sent under the host's limit alone.
	maxSublimits = 256
	maxRoutes    = 1024
	// subSlots is a sub-limit's fixed in-flight limit: high enough never
	// to bind, as the host's limit bounds what is in flight.
	subSlots = 1 << 20
	// maxRoutePath bounds the bytes of a path a route is made from.
	maxRoutePath = 256
)

// splitKey returns a lane key's host key and sub-limit name ("" for a
// host's lane).
func splitKey(key string) (host, sub string) {
	if i := strings.IndexByte(key, subSep[0]); i >= 0 {
		return key[:i], key[i+1:]
	}
	return key, ""
}

// routes files the routes of one host under the sub-limits its responses
// name, and keeps which sub-limits are in use. It is safe for concurrent
// use.
type routes struct {
	mu     sync.Mutex
	byPath map[string]filed // route → where it is filed
	// byHead maps a route's first path segment to where all its filed
	// routes are, or to the zero filed once two of them differ: a route
	// not yet seen goes by its head (GitHub's /repos/... are all core).
	byHead map[string]filed
	used   map[string]time.Time // sub-limit name → its last use
	rates  map[string]float64   // sub-limit name → its pace when last read
	folded uint64               // names past maxSublimits, read as the host's
}

// filed is where a route is filed: the limit its responses name, and
// whether that limit is a bucket kept per major parameter (Discord's: the
// route's first id, a channel or a guild; see majorOf).
type filed struct {
	name  string
	major bool
	at    time.Time // its last use
}

func newRoutes() *routes {
	return &routes{byPath: map[string]filed{}, byHead: map[string]filed{}, used: map[string]time.Time{},
		rates: map[string]float64{}}
}

// lookup returns where route r (see routeOf) is filed; its name is "" if
// nowhere.
func (rs *routes) lookup(r string, now time.Time) filed {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	f, ok := rs.byPath[r]
	if !ok {
		return rs.byHead[routeHead(r)]
	}
	f.at = now
	rs.byPath[r] = f
	return f
}

// admit reports whether name may be a sub-limit: it is one already, or
// there is room for one more. fold: a response named it, and is read as
// the host's if it may not (counted in folded).
func (rs *routes) admit(name string, now time.Time, fold bool) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.used[name]; !ok && len(rs.used) >= maxSublimits {
		if fold {
			rs.folded++
		}
		return false
	}
	rs.used[name] = now
	return true
}

// file files route r under f, named by a response.
func (rs *routes) file(r string, f filed) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	old, ok := rs.byPath[r]
	if !ok && len(rs.byPath) >= maxRoutes {
		return
	}
	rs.byPath[r] = f
	if !ok || old.name != f.name || old.major != f.major {
		rs.headLocked(r, f)
	}
}

// headLocked files r's head under f, unless another route under it is
// filed elsewhere.
func (rs *routes) headLocked(r string, f filed) {
	h := routeHead(r)
	if prev, ok := rs.byHead[h]; !ok {
		rs.byHead[h] = f
	} else if prev.name != f.name || prev.major != f.major {
		rs.byHead[h] = filed{}
	}
}

// paced records that the sub-limit name paces to rate, and returns what
// the sub-limits pace to in all.
func (rs *routes) paced(name string, rate float64) float64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.used[name]; ok {
		rs.rates[name] = rate
	}
	sum := 0.0
	for _, r := range rs.rates {
		sum += r
	}
	return sum
}

// forget drops the sub-limits and routes unused for idle, and reports
// whether nothing is left.
func (rs *routes) forget(now time.Time, idle time.Duration) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for name, at := range rs.used {
		if now.Sub(at) >= idle {
			delete(rs.used, name)
			delete(rs.rates, name)
		}
	}
	for r, f := range rs.byPath {
		if now.Sub(f.at) >= idle {
			delete(rs.byPath, r)
		}
	}
	clear(rs.byHead)
	for r, f := range rs.byPath {
		rs.headLocked(r, f)
	}
	return len(rs.used) == 0 && len(rs.byPath) == 0
}

// majorOf returns the first segment of path that holds a digit (Discord's
// major parameter: the channel, guild or webhook a bucket is kept per),
// or "".
func majorOf(path string) string {
	for seg := range strings.SplitSeq(path, "/") {
		if len(seg) <= maxSublimit && strings.ContainsAny(seg, "0123456789") {
			return seg
		}
	}
	return ""
}

// sublimitName returns the name of the sub-limit of a request to path
// filed under f.
func sublimitName(f filed, path string) string {
	if !f.major {
		return f.name
	}
	if m := majorOf(path); m != "" {
		return f.name + "@" + m
	}
	return f.name
}

// routeOf returns req's route: its method and path, with each segment that
// holds a digit (an id, a number, a hash) folded to "{}", so that the
// calls of one endpoint share a route. Paths past maxRoutePath bytes are
// cut.
func routeOf(req *http.Request) string {
	p := req.URL.Path
	if len(p) > maxRoutePath {
		p = p[:maxRoutePath]
	}
	var b strings.Builder
	b.Grow(len(req.Method) + 1 + len(p))
	b.WriteString(req.Method)
	b.WriteByte(' ')
	for i, seg := range strings.Split(p, "/") {
		if i > 0 {
			b.WriteByte('/')
		}
		if strings.ContainsAny(seg, "0123456789") {
			seg = "{}"
		}
		b.WriteString(seg)
	}
	return b.String()
}

// routeHead returns a route's first path segment.
func routeHead(r string) string {
	if i := strings.IndexByte(r, ' '); i >= 0 {
		r = r[i+1:]
	}
	r = strings.TrimPrefix(r, "/")
	if i := strings.IndexByte(r, '/'); i >= 0 {
		r = r[:i]
	}
	return r
}

// routesOf returns the routes of the lane keyed host, made if create is set,
// else nil if it has none.
func (t *Transport) routesOf(host string, create bool) *routes {
	if v, ok := t.routes.Load(host); ok {
		return v.(*routes)
	}
	if !create {
		return nil
	}
	v, _ := t.routes.LoadOrStore(host, newRoutes())
	t.learned.Store(true)
	return v.(*routes)
}

// sublimitOf returns the sub-limit lane req draws on besides its lane l,
// or nil, and whether the caller named it (see WithSublimit and
// WithSublimitKey) rather than a route filed from the server's answers.
func (t *Transport) sublimitOf(l *lane, req *http.Request) (sub *lane, caller bool) {
	var name string
	if sublimitsNamed.Load() {
		name = SublimitFrom(req.Context())
	}
	if name == "" && t.cfg.sublimitKey != nil {
		name = t.cfg.sublimitKey(req)
	}
	caller = name != ""
	if len(name) > maxSublimit {
		name = name[:maxSublimit]
	}
	now := time.Now()
	rs := t.routesOf(l.key, caller)
	if !caller && rs != nil {
		name = sublimitName(rs.lookup(routeOf(req), now), req.URL.Path)
	}
	if name == "" || !rs.admit(name, now, false) {
		return nil, false
	}
	return t.subLane(l, name), caller
}

// subLane returns the live sub-limit lane name of l.
func (t *Transport) subLane(l *lane, name string) *lane {
	key := l.key + subSep + name
	if v, ok := t.lanes.Load(key); ok {
		if s := v.(*lane); !s.dead.Load() {
			return s
		}
	}
	return t.laneSlow(key, &t.subCfg)
}

// named files req's route under the limit a response named (bucket: a
// bucket kept per major parameter), and returns that sub-limit's lane, or
// nil if the lane has as many sub-limits as it may (see maxSublimits).
func (t *Transport) named(l *lane, req *http.Request, name string, bucket bool) *lane {
	now := time.Now()
	rs := t.routesOf(l.key, true)
	f := filed{name: name, major: bucket, at: now}
	rs.file(routeOf(req), f)
	name = sublimitName(f, req.URL.Path)
	if !rs.admit(name, now, true) {
		return nil
	}
	return t.subLane(l, name)
}
