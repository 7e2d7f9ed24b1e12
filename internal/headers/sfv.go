package headers

import "strings"

// This file holds the small part of Structured Field Values for HTTP
// (RFC 8941, RFC 9651) that the IETF rate-limit fields need: Lists and
// Dictionaries of Items with parameters. Every bare item type is recognised
// so that a well-formed field never fails to parse, but only integers,
// strings and tokens keep their value; everything else (decimals, byte
// sequences, booleans, dates, display strings, inner lists) is validated and
// reduced to its kind.
//
// The parser never allocates except to unescape a string that contains
// backslash escapes. Parameters are kept as validated raw text and re-read
// on lookup, which is cheap for the handful of parameters a field carries.

// sfKind is the type of a parsed bare item.
type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfDecimal
	sfString
	sfToken
	sfOther // byte sequence, boolean, date, display string or inner list
)

// sfItem is one List or Dictionary member.
type sfItem struct {
	kind   sfKind
	num    int64  // value of an sfInteger
	str    string // value of an sfString (unescaped) or sfToken
	key    string // member name in a Dictionary; empty in a List
	params string // validated parameters, each starting with ';'
}

// name returns the item's value if it is a string or a token.
func (it sfItem) name() (string, bool) {
	if it.kind == sfString || it.kind == sfToken {
		return it.str, true
	}
	return "", false
}

// param returns the value of the parameter named key. As RFC 9651 requires,
// the last occurrence of a repeated key wins. A parameter without a value
// is a boolean true and is reported with kind sfOther.
func (it sfItem) param(key string) (v sfItem, ok bool) {
	p := sfParser{s: it.params}
	for p.i < len(p.s) {
		p.i++ // ';', guaranteed by validation
		p.skipSP()
		k, _ := p.key()
		var val sfItem
		if p.peek() == '=' {
			p.i++
			val, _ = p.bare()
		} else {
			val = sfItem{kind: sfOther}
		}
		if k == key {
			v, ok = val, true
		}
	}
	return v, ok
}

// parseSFList parses s as a List, appending its members to dst. It fails if
// s is malformed or has more than maxListMembers members. Callers pass a
// slice with capacity maxListMembers so that no allocation happens.
func parseSFList(s string, dst []sfItem) ([]sfItem, bool) {
	return parseSF(s, dst, false)
}

// parseSFDict parses s as a Dictionary, appending its members to dst in
// order of appearance (duplicate keys are kept; callers take the last).
func parseSFDict(s string, dst []sfItem) ([]sfItem, bool) {
	return parseSF(s, dst, true)
}

func parseSF(s string, dst []sfItem, dict bool) ([]sfItem, bool) {
	p := sfParser{s: s}
	p.skipSP()
	if p.i == len(p.s) {
		return dst, true // an empty field is an empty list
	}
	for {
		if len(dst) == maxListMembers {
			return dst, false
		}
		var it sfItem
		var ok bool
		if dict {
			it, ok = p.dictMember()
		} else {
			it, ok = p.member()
		}
		if !ok {
			return dst, false
		}
		dst = append(dst, it)
		p.skipOWS()
		if p.i == len(p.s) {
			return dst, true
		}
		if p.s[p.i] != ',' {
			return dst, false
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return dst, false // trailing comma
		}
	}
}

// looksLikeDict reports whether s starts the way a Dictionary does and a
// List cannot: a key immediately followed by '='.
func looksLikeDict(s string) bool {
	p := sfParser{s: s}
	p.skipSP()
	_, ok := p.key()
	return ok && p.peek() == '='
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// member parses an Item or an Inner List, with parameters.
func (p *sfParser) member() (sfItem, bool) {
	var it sfItem
	var ok bool
	if p.peek() == '(' {
		it, ok = sfItem{kind: sfOther}, p.innerList()
	} else {
		it, ok = p.bare()
	}
	if !ok {
		return it, false
	}
	it.params, ok = p.parameters()
	return it, ok
}

func (p *sfParser) dictMember() (sfItem, bool) {
	k, ok := p.key()
	if !ok {
		return sfItem{}, false
	}
	var it sfItem
	if p.peek() == '=' {
		p.i++
		if it, ok = p.member(); !ok {
			return it, false
		}
	} else {
		it = sfItem{kind: sfOther} // boolean true
		if it.params, ok = p.parameters(); !ok {
			return it, false
		}
	}
	it.key = k
	return it, true
}

func (p *sfParser) innerList() bool {
	p.i++ // '('
	for {
		p.skipSP()
		if p.peek() == ')' {
			p.i++
			return true
		}
		if _, ok := p.bare(); !ok {
			return false
		}
		if _, ok := p.parameters(); !ok {
			return false
		}
		if c := p.peek(); c != ' ' && c != ')' {
			return false
		}
	}
}

// parameters validates a run of parameters and returns its raw text.
func (p *sfParser) parameters() (string, bool) {
	start := p.i
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		if _, ok := p.key(); !ok {
			return "", false
		}
		if p.peek() == '=' {
			p.i++
			if _, ok := p.bare(); !ok {
				return "", false
			}
		}
	}
	return p.s[start:p.i], true
}

func (p *sfParser) key() (string, bool) {
	start := p.i
	if c := p.peek(); !isLCAlpha(c) && c != '*' {
		return "", false
	}
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !isLCAlpha(c) && !isDigit(c) && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], true
}

// bare parses a Bare Item.
func (p *sfParser) bare() (sfItem, bool) {
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		s, ok := p.str()
		return sfItem{kind: sfString, str: s}, ok
	case c == '*' || isAlpha(c):
		return sfItem{kind: sfToken, str: p.token()}, true
	case c == ':':
		return sfItem{kind: sfOther}, p.byteSeq()
	case c == '?':
		p.i++
		if c := p.peek(); c == '0' || c == '1' {
			p.i++
			return sfItem{kind: sfOther}, true
		}
		return sfItem{}, false
	case c == '@': // RFC 9651 Date
		p.i++
		it, ok := p.number()
		return sfItem{kind: sfOther}, ok && it.kind == sfInteger
	case c == '%': // RFC 9651 Display String
		return sfItem{kind: sfOther}, p.displayString()
	}
	return sfItem{}, false
}

// number parses an Integer or Decimal as RFC 9651 section 4.2.4 specifies:
// at most 15 integer digits, or 12 digits, '.', and 1 to 3 digits.
func (p *sfParser) number() (sfItem, bool) {
	neg := false
	if p.peek() == '-' {
		neg = true
		p.i++
	}
	if !isDigit(p.peek()) {
		return sfItem{}, false
	}
	var n int64
	digits, frac, dot := 0, 0, false
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case isDigit(c):
			if dot {
				frac++
			} else {
				n = n*10 + int64(c-'0')
				digits++
			}
		case c == '.' && !dot:
			if digits > 12 {
				return sfItem{}, false
			}
			dot = true
		default:
			goto done
		}
		p.i++
		if digits > 15 || frac > 3 {
			return sfItem{}, false
		}
	}
done:
	if dot {
		if frac == 0 {
			return sfItem{}, false
		}
		return sfItem{kind: sfDecimal}, true
	}
	if neg {
		n = -n
	}
	return sfItem{kind: sfInteger, num: n}, true
}

func (p *sfParser) str() (string, bool) {
	p.i++ // '"'
	start := p.i
	var b *strings.Builder // only when the string has escapes
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			if b == nil {
				return p.s[start : p.i-1], true
			}
			return b.String(), true
		case c == '\\':
			if p.i+1 == len(p.s) {
				return "", false
			}
			e := p.s[p.i+1]
			if e != '"' && e != '\\' {
				return "", false
			}
			if b == nil {
				b = new(strings.Builder)
				b.WriteString(p.s[start:p.i])
			}
			b.WriteByte(e)
			p.i += 2
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			if b != nil {
				b.WriteByte(c)
			}
			p.i++
		}
	}
	return "", false // unterminated
}

func (p *sfParser) token() string {
	start := p.i
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !isTchar(c) && c != ':' && c != '/' {
			break
		}
		p.i++
	}
	return p.s[start:p.i]
}

func (p *sfParser) byteSeq() bool {
	p.i++ // ':'
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == ':':
			return true
		case isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=':
		default:
			return false
		}
	}
	return false
}

func (p *sfParser) displayString() bool {
	p.i++ // '%'
	if p.peek() != '"' {
		return false
	}
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			return true
		case c == '%':
			if p.i+2 > len(p.s) || !isLCHex(p.s[p.i]) || !isLCHex(p.s[p.i+1]) {
				return false
			}
			p.i += 2
		case c < 0x20 || c > 0x7e:
			return false
		}
	}
	return false
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isLCHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' }

// isTchar reports whether c is a tchar (RFC 9110 section 5.6.2).
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
