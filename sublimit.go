package sluice

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Sub-limits: several limits behind one host. A lane keeps the host's
// limit (WithRate, the in-flight limit, global cooldowns); a sub-limit is
// one of the limits behind it that only some requests count against
// (GitHub's search beside core, a Discord bucket, one LLM model). A
// sub-limit is a lane of its own, kept beside its host's lane under the
// key host + subSep + name, with the host's options except that it has no
// in-flight limit of its own and no configured rate but the one
// WithSublimitRate gives its name (see Transport.subCfg): it paces by that
// and by what its responses say. A request with a sub-limit takes its
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
// its first 64. Where the server names the limit a request's route counts
// against (see WithSublimitKey), that limit is drawn on instead.
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
	// a lane without bound. A response that names a limit past the cap
	// teaches no lane anything (counted in LaneStats.Folded); past
	// maxRoutes, the route used longest ago is forgotten.
	maxSublimits = 256
	maxRoutes    = 1024
	// subSlots is a sub-limit's fixed in-flight limit: high enough never
	// to bind, as the host's limit bounds what is in flight.
	subSlots = 1 << 20
	// maxRoutePath bounds the bytes of a path a route is made from.
	maxRoutePath = 256
)

// name returns the lane's key for a reader: a sub-limit's is its host's
// key, "/" and its name (see LaneStats.Name).
func (l *lane) name() string {
	host, sub := splitKey(l.key)
	if sub == "" {
		return host
	}
	return host + "/" + sub
}

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
	byPath map[string]filed     // route → where it is filed
	used   map[string]time.Time // sub-limit name → its last use
	folded uint64               // responses that named a limit past maxSublimits
	// filedUnder counts the routes filed under each limit that is not a
	// bucket kept per major parameter (see fallback).
	filedUnder map[string]int
	// unnamed is when a response of the host last named no limit, in
	// Unix nanoseconds, to the second; 0: none has (see fallback).
	unnamed atomic.Int64
}

// filed is where a route is filed: the limit its responses name, and
// whether that limit is a bucket kept per major parameter (Discord's: a
// channel, a guild; see majorOf).
type filed struct {
	name  string
	major bool
	at    time.Time // its last use
	sub   *lane     // the sub-limit's lane, once looked up, if not major
}

func newRoutes() *routes {
	return &routes{byPath: map[string]filed{}, used: map[string]time.Time{}, filedUnder: map[string]int{}}
}

// unnamedFor is how long after a response of a host that named no limit
// the host's routes not filed yet have no fallback (see fallback).
const unnamedFor = 10 * time.Minute

// fallback returns the limit a route not filed yet goes under: the one
// most routes are filed under, on a host whose every response names its
// limit (GitHub's name a resource: core, search, graphql), or "" if a
// response named none within unnamedFor (its routes may be the host's
// alone). A client that calls a new path per request (a crawler, one
// repository after another) would otherwise send each first call past an
// exhausted limit, which GitHub answers with a 403 and, repeated, a ban.
// The route's first answer files it where it belongs.
func (rs *routes) fallback(now time.Time) string {
	if u := rs.unnamed.Load(); u != 0 && now.Sub(time.Unix(0, u)) < unnamedFor {
		return ""
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	best, most := "", 0
	for name, n := range rs.filedUnder {
		if n > most || n == most && name < best {
			best, most = name, n
		}
	}
	if best == "" || !rs.admitLocked(best, now, false) {
		return ""
	}
	return best
}

// sawUnnamed records a response of the host, at now, that named no limit.
func (rs *routes) sawUnnamed(now time.Time) {
	if n := now.UnixNano(); n-rs.unnamed.Load() >= int64(time.Second) {
		rs.unnamed.Store(n)
	}
}

// countLocked adds d to the routes counted as filed under f (see
// filedUnder).
func (rs *routes) countLocked(f filed, d int) {
	if f.major || f.name == "" {
		return
	}
	if rs.filedUnder[f.name] += d; rs.filedUnder[f.name] <= 0 {
		delete(rs.filedUnder, f.name)
	}
}

// lookup returns the name of the sub-limit that route r (see routeOf) of
// a request to path is filed under, and its lane if known and alive; ""
// if r is filed nowhere, or its sub-limit would pass maxSublimits. It
// counts the use of both.
func (rs *routes) lookup(r, path string, now time.Time) (string, *lane) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	f, ok := rs.byPath[r]
	if !ok {
		return "", nil
	}
	name := sublimitName(f, path)
	if !rs.admitLocked(name, now, false) {
		return "", nil
	}
	f.at = now
	rs.byPath[r] = f
	if f.sub != nil && f.sub.isDead() {
		return name, nil
	}
	return name, f.sub
}

// remember keeps sub, the lane of the sub-limit route r is filed under,
// for the route's next lookups, unless r was filed anew since under
// another limit.
func (rs *routes) remember(r string, sub *lane) {
	_, name := splitKey(sub.key)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if f, ok := rs.byPath[r]; ok && !f.major && f.name == name {
		f.sub = sub
		rs.byPath[r] = f
	}
}

// admit reports whether name may be a sub-limit: it is one already, or
// there is room for one more. fold: a response named it, and is counted
// in folded if it may not.
func (rs *routes) admit(name string, now time.Time, fold bool) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.admitLocked(name, now, fold)
}

func (rs *routes) admitLocked(name string, now time.Time, fold bool) bool {
	if _, ok := rs.used[name]; !ok && len(rs.used) >= maxSublimits {
		if fold {
			rs.folded++
		}
		return false
	}
	rs.used[name] = now
	return true
}

// file files route r under f, named by a response. Past maxRoutes, the
// route used longest ago makes room.
func (rs *routes) file(r string, f filed) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	old, ok := rs.byPath[r]
	if !ok && len(rs.byPath) >= maxRoutes {
		var oldest string
		var at time.Time
		for k, o := range rs.byPath {
			if oldest == "" || o.at.Before(at) {
				oldest, at = k, o.at
			}
		}
		rs.countLocked(rs.byPath[oldest], -1)
		delete(rs.byPath, oldest)
	}
	if ok {
		rs.countLocked(old, -1)
	}
	rs.countLocked(f, 1)
	rs.byPath[r] = f
}

// forget drops the sub-limits unused for idle whose lanes are gone (alive
// reports a sub-limit's lane still there: one that cools down outlives
// its idle time, and still counts toward maxSublimits), and the routes
// unused for idle whose sub-limits are dropped: a route filed under a
// limit that still cools down leads its calls to that limit's wait. It
// reports whether nothing is left.
func (rs *routes) forget(now time.Time, idle time.Duration, alive func(name string) bool) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	kept := make(map[string]bool, len(rs.used))
	for name, at := range rs.used {
		if now.Sub(at) >= idle && !alive(name) {
			delete(rs.used, name)
			continue
		}
		kept[name] = true
		// A bucket kept per major parameter is filed under the name
		// before the parameter (see sublimitName).
		if i := strings.LastIndexByte(name, '@'); i > 0 {
			kept[name[:i]] = true
		}
	}
	for r, f := range rs.byPath {
		if now.Sub(f.at) >= idle && !kept[f.name] {
			rs.countLocked(f, -1)
			delete(rs.byPath, r)
		}
	}
	return len(rs.used) == 0 && len(rs.byPath) == 0
}

// majorOf returns a path's major parameter, which Discord keeps a bucket
// per: the id after "channels", "guilds" or "webhooks", else the first
// segment that holds a digit and is no API version ("v10"); or "".
func majorOf(path string) string {
	prev, first := "", ""
	for seg := range strings.SplitSeq(path, "/") {
		if len(seg) <= maxSublimit && hasDigit(seg) {
			switch {
			case prev == "channels" || prev == "guilds" || prev == "webhooks":
				return seg
			case first == "" && !isVersion(seg):
				first = seg
			}
		}
		prev = seg
	}
	return first
}

// isVersion reports a path segment such as "v10".
func isVersion(seg string) bool {
	if len(seg) < 2 || seg[0] != 'v' {
		return false
	}
	for i := 1; i < len(seg); i++ {
		if seg[i] < '0' || seg[i] > '9' {
			return false
		}
	}
	return true
}

func hasDigit(s string) bool { return strings.ContainsAny(s, "0123456789") }

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

// callerName returns a name a caller gave as a sub-limit's: cut to
// maxSublimit bytes at a character's start, with invalid UTF-8 replaced,
// as the exporters need.
func callerName(name string) string {
	if len(name) > maxSublimit {
		i := maxSublimit
		for i > 0 && !utf8.RuneStart(name[i]) {
			i--
		}
		name = name[:i]
	}
	return strings.ToValidUTF8(name, "\uFFFD")
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
	for {
		seg, rest, more := strings.Cut(p, "/")
		if hasDigit(seg) {
			seg = "{}"
		}
		b.WriteString(seg)
		if !more {
			return b.String()
		}
		b.WriteByte('/')
		p = rest
	}
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
// or nil, whether the caller named it (see WithSublimit and
// WithSublimitKey), and whether it is the host's fallback (see
// routes.fallback): req's route is filed nowhere. Where a response named
// the limit of req's route, that one is drawn on: a caller's name is for
// where the server names none.
func (t *Transport) sublimitOf(l *lane, req *http.Request) (sub *lane, caller, fallback bool) {
	now := time.Now()
	rs := t.routesOf(l.key, false)
	if rs != nil {
		r := routeOf(req)
		name, sub := rs.lookup(r, req.URL.Path, now)
		if sub != nil {
			return sub, false, false
		}
		if name != "" {
			sub = t.subLane(l, name)
			rs.remember(r, sub)
			return sub, false, false
		}
	}
	name := t.callerSublimit(req)
	if name == "" {
		if rs != nil {
			if name := rs.fallback(now); name != "" {
				return t.subLane(l, name), false, true
			}
		}
		return nil, false, false
	}
	if !t.routesOf(l.key, true).admit(name, now, false) {
		return nil, false, false
	}
	return t.subLane(l, name), true, false
}

// subLane returns the live sub-limit lane name of l.
func (t *Transport) subLane(l *lane, name string) *lane {
	key := l.key + subSep + name
	if v, ok := t.lanes.Load(key); ok {
		if s := v.(*lane); !s.isDead() {
			return s
		}
	}
	cfg := &t.subCfg
	if c, ok := t.subRated[name]; ok {
		cfg = c
	}
	return t.laneSlow(key, cfg)
}

// named files req's route under the limit a response named (bucket: a
// bucket kept per major parameter), and returns that sub-limit's lane, or
// nil if the lane has as many sub-limits as it may (see maxSublimits).
// filedAs is the lane req's route was found filed under, if any: when the
// response names that limit again, nothing is filed anew.
func (t *Transport) named(l *lane, req *http.Request, name string, bucket bool, filedAs *lane) *lane {
	if filedAs != nil && isNamed(filedAs, name, bucket, req.URL.Path) {
		return filedAs
	}
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

// isNamed reports whether sub is the sub-limit lane of the limit name
// (bucket: kept per major parameter) for a request to path.
func isNamed(sub *lane, name string, bucket bool, path string) bool {
	_, sn := splitKey(sub.key)
	if !bucket {
		return sn == name
	}
	rest, ok := strings.CutPrefix(sn, name)
	if m := majorOf(path); m != "" {
		return ok && len(rest) == 1+len(m) && rest[0] == '@' && rest[1:] == m
	}
	return ok && rest == ""
}

// coolEnd returns when the lane's cooldown ends, and whether a request of
// ctx at a level of WithMaxWait maxWait (0: none) waits for it: not if it
// has ended, nor if ctx's deadline comes first or the wait is longer than
// maxWait (the grant that follows refuses such a request at once).
func (l *lane) coolEnd(ctx context.Context, maxWait time.Duration) (time.Time, bool) {
	l.lock()
	until, now := l.pace.Cooldown(), l.clk.tick()
	l.unlock()
	if until <= now {
		return time.Time{}, false // the cooldown's zero value is far in the past: no subtraction
	}
	d := until - now
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d || maxWait > 0 && d > maxWait {
		return time.Time{}, false
	}
	return l.clk.timeOf(until), true
}

// holdTo holds the sub-limit lane's grants back until until (its host's
// cooldown ends): its waiters wait in its queue, in priority order.
func (l *lane) holdTo(until time.Time) {
	l.lock()
	l.pace.Hold(l.clk.tick(), l.clk.ticks(until))
	l.unlock()
}

// chargedLane returns the lane that drew the costs of req, sent through
// its lane l: the sub-limit the caller named, where the server names none
// for req's route (see sublimitOf), else l; nil if that sub-limit was
// forgotten since.
func (t *Transport) chargedLane(l *lane, req *http.Request) *lane {
	if !t.learned.Load() {
		return l
	}
	rs := t.routesOf(l.key, false)
	if rs == nil {
		return l
	}
	if name, _ := rs.lookup(routeOf(req), req.URL.Path, time.Now()); name != "" {
		return l
	}
	name := t.callerSublimit(req)
	if name == "" {
		return l
	}
	return t.find(l.key + subSep + name)
}

// callerSublimit returns the sub-limit the caller names for req, by its
// context (see WithSublimit) or else WithSublimitKey, as a lane keeps it
// (see callerName); "" if none.
func (t *Transport) callerSublimit(req *http.Request) string {
	var name string
	if sublimitsNamed.Load() {
		name = SublimitFrom(req.Context())
	}
	if name == "" && t.cfg.sublimitKey != nil {
		name = t.cfg.sublimitKey(req)
	}
	return callerName(name)
}
