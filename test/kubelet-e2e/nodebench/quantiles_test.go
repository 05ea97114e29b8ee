package nodebench

import (
	"math"
	"testing"
)

func TestQuantilesOf(t *testing.T) {
	if q := QuantilesOf(nil); q.N != 0 || q.P50 != nil || q.Max != nil {
		t.Errorf("QuantilesOf(nil) = %+v, want nothing", q)
	}
	v := make([]float64, 0, 100)
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i)+0.04)
	}
	q := QuantilesOf(v)
	for _, c := range []struct {
		name string
		got  *float64
		want float64
	}{{"p50", q.P50, 50}, {"p90", q.P90, 90}, {"p99", q.P99, 99}, {"max", q.Max, 100}} {
		if c.got == nil || *c.got != c.want {
			t.Errorf("%s = %v, want %g (rounded to 0.1 ms)", c.name, c.got, c.want)
		}
	}
	if q.N != 100 || v[0] != 100.04 {
		t.Errorf("n = %d, input[0] = %g: want 100 samples, the input unsorted", q.N, v[0])
	}
}

func TestCells(t *testing.T) {
	one := 4.25
	for _, c := range []struct{ got, want string }{
		{Ms(4.25), "4.2 ms"}, {Ms(130.4), "130 ms"}, {Ms(math.NaN()), "-"}, {Ms(Max(nil)), "-"},
		{Cell(nil), "-"}, {Cell(&one), "4.2 ms"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
