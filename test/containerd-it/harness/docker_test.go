package harness

import (
	"slices"
	"testing"
)

func TestCapsMissing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  string
		lastCap int
		want    []string
		wantErr bool
	}{
		{name: "every capability", status: "Name:\tx\nCapBnd:\t000001ffffffffff\n", lastCap: 40},
		{name: "this project's machines", status: "CapBnd:\t000001fffeffffff\n", lastCap: 40, want: []string{"SYS_RESOURCE"}},
		{name: "kernel knows fewer", status: "CapBnd:\t000000ffffffffff\n", lastCap: 39},
		{name: "kernel knows fewer, one missing", status: "CapBnd:\t000000fffffffffe\n", lastCap: 39, want: []string{"CHOWN"}},
		{name: "several", status: "CapBnd:\t000001fffeffffdf\n", lastCap: 40, want: []string{"KILL", "SYS_RESOURCE"}},
		{name: "a newer kernel than the table", status: "CapBnd:\t00000fffffffffff\n", lastCap: 43},
		{name: "no CapBnd", status: "Name:\tx\n", lastCap: 40, wantErr: true},
		{name: "garbage", status: "CapBnd:\tzz\n", lastCap: 40, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := capsMissing(tc.status, tc.lastCap)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("capsMissing = %v, want %v", got, tc.want)
			}
		})
	}
}
