package headers

import (
	"net/http"
	"time"
)

// parseHTTPDate is http.ParseTime with a fast path for the one form servers
// send in practice, IMF-fixdate ("Tue, 02 Jan 2024 15:04:05 GMT"). Parse
// needs the Date field whenever a reset is an absolute time, as GitHub's
// always are, and http.ParseTime, which goes through time.Parse, cost about
// as much as all the rest of Parse. The fast path accepts only a subset of
// what time.Parse accepts for http.TimeFormat (exact case and spacing, two
// digits for the hour) and builds the same time.Date; anything else goes
// to http.ParseTime, so the result is the same for every input.
func parseHTTPDate(s string) (time.Time, bool) {
	if t, ok := parseIMFFixdate(s); ok {
		return t, true
	}
	t, err := http.ParseTime(s)
	return t, err == nil
}

// parseDate parses an HTTP-date as parseHTTPDate does, and also the
// layout of Go's time.RFC1123 for a time in UTC, "Tue, 02 Jan 2024
// 15:04:05 UTC": IMF-fixdate with the zone named "UTC" instead of "GMT",
// which middleware that formats its reset with time.RFC1123 sends (for
// instance in X-RateLimit-Reset and Retry-After). Only that exact form is
// added; any other zone name is still rejected.
func parseDate(s string) (time.Time, bool) {
	if t, ok := parseHTTPDate(s); ok {
		return t, true
	}
	if len(s) != len(http.TimeFormat) || s[25:] != " UTC" {
		return time.Time{}, false
	}
	var buf [len(http.TimeFormat)]byte
	copy(buf[:], s[:25])
	copy(buf[25:], " GMT")
	return parseIMFFixdate(string(buf[:]))
}

// parseIMFFixdate parses s if it is exactly of the form
// "Mon, 02 Jan 2006 15:04:05 GMT" with a valid date and time of day. The
// day name is not checked against the date, as time.Parse does not check
// it either.
func parseIMFFixdate(s string) (time.Time, bool) {
	if len(s) != len(http.TimeFormat) ||
		s[3] != ',' || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' ||
		s[19] != ':' || s[22] != ':' || s[25:] != " GMT" {
		return time.Time{}, false
	}
	switch s[:3] {
	case "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun":
	default:
		return time.Time{}, false
	}
	for _, i := range [...]int{5, 6, 12, 13, 14, 15, 17, 18, 20, 21, 23, 24} {
		if !isDigit(s[i]) {
			return time.Time{}, false
		}
	}
	num := func(i int) int { return int(s[i]-'0')*10 + int(s[i+1]-'0') }
	year, month, day := num(12)*100+num(14), imfMonth(s[8:11]), num(5)
	hour, minute, sec := num(17), num(20), num(23)
	if month == 0 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	return time.Date(year, month, day, hour, minute, sec, 0, time.UTC), true
}

// imfMonth returns the month abbreviated as s, or 0.
func imfMonth(s string) time.Month {
	switch s {
	case "Jan":
		return time.January
	case "Feb":
		return time.February
	case "Mar":
		return time.March
	case "Apr":
		return time.April
	case "May":
		return time.May
	case "Jun":
		return time.June
	case "Jul":
		return time.July
	case "Aug":
		return time.August
	case "Sep":
		return time.September
	case "Oct":
		return time.October
	case "Nov":
		return time.November
	case "Dec":
		return time.December
	}
	return 0
}

// daysIn returns the number of days in month m of year y (proleptic
// Gregorian, as package time counts).
func daysIn(m time.Month, y int) int {
	switch m {
	case time.February:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}
