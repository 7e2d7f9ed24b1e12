package headers

import "testing"

func TestParseSFList(t *testing.T) {
	valid := []struct {
		in    string
		n     int
		first sfItem
	}{
		{``, 0, sfItem{}},
		{`   `, 0, sfItem{}},
		{`1`, 1, sfItem{kind: sfInteger, num: 1}},
		{`-999999999999999`, 1, sfItem{kind: sfInteger, num: -999999999999999}},
		{`1.5, 2`, 2, sfItem{kind: sfDecimal}},
		{`"a\\b\"c" , tok`, 2, sfItem{kind: sfString, str: `a\b"c`}},
		{`*tok:/x;a;b=?0;*c=:AQ==:`, 1, sfItem{kind: sfToken, str: `*tok:/x`, params: `;a;b=?0;*c=:AQ==:`}},
		{`("a" 1;x=2 b);q=1,	x`, 2, sfItem{kind: sfOther, params: `;q=1`}},
		{`()`, 1, sfItem{kind: sfOther}},
		{`@1659578233, %"caf%c3%a9"`, 2, sfItem{kind: sfOther}},
		{`a; b=1`, 1, sfItem{kind: sfToken, str: "a", params: `; b=1`}},
	}
	for _, tt := range valid {
		var buf [maxListMembers]sfItem
		got, ok := parseSFList(tt.in, buf[:0])
		if !ok || len(got) != tt.n || tt.n > 0 && got[0] != tt.first {
			t.Errorf("parseSFList(%q) = %+v, %v; want %d members, first %+v", tt.in, got, ok, tt.n, tt.first)
		}
	}
	invalid := []string{
		`1,`, `,1`, `1,,2`, `1 2`, `"unterminated`, `"bad\escape"`, "\"ctl\x01\"",
		`1234567890123456`, `1234567890123.5`, `1.2345`, `1.`, `-`, `--1`, `-a`,
		`a;B=1`, `a ;q=1`, `(1) ;q=1`, `a;=1`, `a;1=1`, `(1 2`, `(1,2)`, `:AQ==`, `:A Q:`, `?2`, `@1.5`,
		`%"x`, `%"%C3"`, `%x`, `é`, `a=1`, `#`, "\ta",
	}
	for _, in := range invalid {
		var buf [maxListMembers]sfItem
		if got, ok := parseSFList(in, buf[:0]); ok {
			t.Errorf("parseSFList(%q) = %+v, true; want false", in, got)
		}
	}
}

func TestParseSFDict(t *testing.T) {
	var buf [maxListMembers]sfItem
	got, ok := parseSFDict(`limit=100, remaining=50;w=1, flag, reset=(1 2), x="y"`, buf[:0])
	if !ok || len(got) != 5 {
		t.Fatalf("parseSFDict = %+v, %v", got, ok)
	}
	want := []sfItem{
		{kind: sfInteger, num: 100, key: "limit"},
		{kind: sfInteger, num: 50, key: "remaining", params: ";w=1"},
		{kind: sfOther, key: "flag"},
		{kind: sfOther, key: "reset"},
		{kind: sfString, str: "y", key: "x"},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	for _, in := range []string{`limit=`, `Limit=1`, `a=1,`, `a=1 b=2`} {
		if got, ok := parseSFDict(in, buf[:0]); ok {
			t.Errorf("parseSFDict(%q) = %+v, true; want false", in, got)
		}
	}
}

func TestParam(t *testing.T) {
	var buf [maxListMembers]sfItem
	items, ok := parseSFList(`p;q=1;w=60;q=2;flag;s="x"`, buf[:0])
	if !ok {
		t.Fatal("parse failed")
	}
	it := items[0]
	if v, ok := it.param("q"); !ok || v.kind != sfInteger || v.num != 2 {
		t.Errorf(`param("q") = %+v, %v; want 2 (last wins)`, v, ok)
	}
	if v, ok := it.param("flag"); !ok || v.kind != sfOther {
		t.Errorf(`param("flag") = %+v, %v; want boolean`, v, ok)
	}
	if v, ok := it.param("s"); !ok || v.kind != sfString || v.str != "x" {
		t.Errorf(`param("s") = %+v, %v`, v, ok)
	}
	if _, ok := it.param("r"); ok {
		t.Error(`param("r") found`)
	}
}

func TestLooksLikeDict(t *testing.T) {
	for in, want := range map[string]bool{
		`limit=100, remaining=5`: true,
		` reset=3`:               true,
		`"default";r=5`:          false,
		`default;r=5`:            false,
		`limit, x=1`:             false,
		`Limit=1`:                false,
	} {
		if got := looksLikeDict(in); got != want {
			t.Errorf("looksLikeDict(%q) = %v; want %v", in, got, want)
		}
	}
}
