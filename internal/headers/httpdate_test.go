package headers

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

var httpDateCases = []string{
	"Tue, 02 Jan 2024 15:04:05 GMT",
	"Thu, 29 Feb 2024 23:59:59 GMT", // leap year
	"Tue, 29 Feb 2000 00:00:00 GMT", // divisible by 400
	"Thu, 29 Feb 1900 00:00:00 GMT", // divisible by 100 only: no such day
	"Wed, 29 Feb 2023 00:00:00 GMT",
	"Sat, 01 Jan 0000 00:00:00 GMT", // year 0 is a leap year
	"Tue, 29 Feb 0000 00:00:00 GMT",
	"Fri, 31 Dec 9999 23:59:59 GMT",
	"Mon, 31 Apr 2024 00:00:00 GMT",
	"Mon, 00 Jan 2024 00:00:00 GMT",
	"Mon, 32 Jan 2024 00:00:00 GMT",
	"Mon, 01 Jan 2024 24:00:00 GMT",
	"Mon, 01 Jan 2024 23:60:00 GMT",
	"Mon, 01 Jan 2024 23:59:60 GMT",
	"Sun, 02 Jan 2024 15:04:05 GMT", // wrong day name: accepted, as by time.Parse
	"tue, 02 jan 2024 15:04:05 GMT", // case: time.Parse accepts, the fast path leaves it to it
	"Tue, 02 Jan 2024 15:04:05 gmt",
	"Tue,  2 Jan 2024 15:04:05 GMT",
	"Tue, 02 Jan 2024  5:04:05 GMT",
	"Tue, 02 Jan 2024 15:04:05.123 GMT",
	"Tue, 02 Jan 2024 15:04:05 UTC",
	"Tue, 02 Jan 24 15:04:05 GMT",
	"Tuesday, 02-Jan-24 15:04:05 GMT",
	"Tue Jan  2 15:04:05 2024",
	"Tue, 02 Jan 2024 15:04:05 GMT ",
	"Tue, 02 Jan 2024 15:04:05 GMX",
	"Tue, 0x Jan 2024 15:04:05 GMT",
	"Tue, 02 Jan -024 15:04:05 GMT",
	"Tue, 02 Jan 2024 15:04:0٥ GMT",
	"",
}

func TestParseHTTPDate(t *testing.T) {
	for _, s := range httpDateCases {
		checkHTTPDate(t, s)
	}
	// Every month's last days in common, leap and century years, and the
	// edges of the time of day. In this exact form the fast path must
	// accept what time.Parse accepts, or it would be no faster.
	months := [...]string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}
	for _, year := range []string{"0000", "1600", "1900", "2000", "2023", "2024", "2100", "9999"} {
		for _, month := range months {
			for _, day := range []string{"00", "01", "28", "29", "30", "31", "32"} {
				for _, clock := range []string{"00:00:00", "23:59:59", "24:00:00", "23:60:00", "23:59:60"} {
					s := "Mon, " + day + " " + month + " " + year + " " + clock + " GMT"
					checkHTTPDate(t, s)
					_, fast := parseIMFFixdate(s)
					_, err := time.Parse(http.TimeFormat, s)
					if fast != (err == nil) {
						t.Errorf("parseIMFFixdate(%q) ok = %v; time.Parse error %v", s, fast, err)
					}
				}
			}
		}
	}
}

// FuzzParseHTTPDate checks parseHTTPDate against http.ParseTime, and its
// fast path against the layout http.ParseTime tries first.
func FuzzParseHTTPDate(f *testing.F) {
	for _, s := range httpDateCases {
		f.Add(s)
	}
	f.Fuzz(checkHTTPDate)
}

func checkHTTPDate(t *testing.T, s string) {
	got, ok := parseHTTPDate(s)
	want, err := http.ParseTime(s)
	// time.Parse gives a zone named in the input a new Location each time,
	// so == cannot compare results that went through it twice.
	if ok != (err == nil) || ok && !sameTime(got, want) {
		t.Errorf("parseHTTPDate(%q) = %v, %v; http.ParseTime gives %v, %v", s, got, ok, want, err)
	}
	if fast, ok := parseIMFFixdate(s); ok {
		if want, err := time.Parse(http.TimeFormat, s); err != nil || fast != want {
			t.Errorf("parseIMFFixdate(%q) = %v, true; time.Parse gives %v, %v", s, fast, want, err)
		}
	}
}

// sameTime reports whether a and b are the same instant in zones of the
// same name and offset.
func sameTime(a, b time.Time) bool {
	an, ao := a.Zone()
	bn, bo := b.Zone()
	return a.Equal(b) && an == bn && ao == bo
}

// parseDate accepts what parseHTTPDate accepts, and IMF-fixdate with the
// zone "UTC" as the same instant; nothing else.
func TestParseDate(t *testing.T) {
	for _, tt := range []struct {
		s    string
		want time.Time
		ok   bool
	}{
		{"Tue, 02 Jan 2024 15:04:05 UTC", time.Date(2024, time.January, 2, 15, 4, 5, 0, time.UTC), true},
		{"Tue, 02 Jan 2024 15:04:05 GMT", time.Date(2024, time.January, 2, 15, 4, 5, 0, time.UTC), true},
		{"Thu, 29 Feb 2024 23:59:59 UTC", time.Date(2024, time.February, 29, 23, 59, 59, 0, time.UTC), true},
		{"Wed, 29 Feb 2023 00:00:00 UTC", time.Time{}, false},
		{"Tue, 02 Jan 2024 24:00:00 UTC", time.Time{}, false},
		{"Tue, 02 Jan 2024 15:04:05 utc", time.Time{}, false},
		{"Tue, 02 Jan 2024 15:04:05 UTC ", time.Time{}, false},
		{"Tue,  2 Jan 2024 15:04:05 UTC", time.Time{}, false},
		{"Tue, 02 Jan 2024 15:04:05 EST", time.Time{}, false},
		{"Tue, 02 Jan 2024 15:04:05 +0000", time.Time{}, false},
		{"Tuesday, 02-Jan-24 15:04:05 UTC", time.Date(2024, time.January, 2, 15, 4, 5, 0, time.UTC), true}, // RFC 850: http.ParseTime takes any zone name there
		{"", time.Time{}, false},
	} {
		got, ok := parseDate(tt.s)
		if ok != tt.ok || !got.Equal(tt.want) {
			t.Errorf("parseDate(%q) = %v, %v; want %v, %v", tt.s, got, ok, tt.want, tt.ok)
		}
	}
	for _, s := range httpDateCases {
		checkDate(t, s)
	}
}

// FuzzParseDate checks parseDate against parseHTTPDate and, for the "UTC"
// form, against time.Parse with time.RFC1123.
func FuzzParseDate(f *testing.F) {
	for _, s := range httpDateCases {
		f.Add(s)
	}
	f.Add("Tue, 02 Jan 2024 15:04:05 UTC")
	f.Add("Mon, 31 Apr 2024 00:00:00 UTC")
	f.Fuzz(checkDate)
}

func checkDate(t *testing.T, s string) {
	got, ok := parseDate(s)
	if want, wantOK := parseHTTPDate(s); wantOK {
		if !ok || !got.Equal(want) {
			t.Errorf("parseDate(%q) = %v, %v; parseHTTPDate gives %v, true", s, got, ok, want)
		}
		return
	}
	if !ok {
		return
	}
	// Only the exact UTC form is added, and it means what time.RFC1123
	// means by it.
	want, err := time.Parse(time.RFC1123, s)
	if !strings.HasSuffix(s, " UTC") || len(s) != len(http.TimeFormat) || err != nil || !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("parseDate(%q) = %v, true; time.Parse(RFC1123) gives %v, %v", s, got, want, err)
	}
}
