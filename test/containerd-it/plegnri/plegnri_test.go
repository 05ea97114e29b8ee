package plegnri

import "testing"

func TestReadSourceOf(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{nil, ""},
		{[]string{"--listen", "unix:///x"}, ""},
		{[]string{"--read-source", "check"}, "check"},
		{[]string{"--read-source=state"}, "state"},
		{[]string{"--read-source", "check", "--read-source=runtime"}, "runtime"}, // the last one wins, as the flag parser's
		{[]string{"--read-source"}, ""},
	} {
		if got := readSourceOf(c.flags); got != c.want {
			t.Errorf("readSourceOf(%q) = %q, want %q", c.flags, got, c.want)
		}
	}
}
