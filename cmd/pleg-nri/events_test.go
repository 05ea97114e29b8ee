package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEventsEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  func(string) string
		want string
	}{
		{"default", nil, noEnv, "unix:///run/pleg-nri/cri.sock"},
		{"environment", nil, endpointEnv("unix:///run/containerd/containerd.sock"), "unix:///run/containerd/containerd.sock"},
		{"flag over environment", []string{"--runtime-endpoint", "/a.sock"}, endpointEnv("/b.sock"), "/a.sock"},
		{"-r", []string{"-r", "tcp://127.0.0.1:1"}, noEnv, "tcp://127.0.0.1:1"},
		{"--endpoint", []string{"--endpoint=/c.sock"}, endpointEnv("/b.sock"), "/c.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseEventsFlags(tc.args, tc.env, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if o.Endpoint != tc.want {
				t.Errorf("endpoint = %q, want %q", o.Endpoint, tc.want)
			}
		})
	}
}

func TestEventsFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "xml"}, "want table, json, yaml or go-template"},
		{[]string{"-o", "go-template"}, "needs --template"},
		{[]string{"-o", "go-template", "--template", "{{.x"}, "--template:"},
		{[]string{"-o", "json", "--template", "{{.x}}"}, "can't be used with --output json"},
		{[]string{"--type", "exited"}, "--type: want created, started, stopped or deleted"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseEventsFlags(tc.args, noEnv, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// TestRunEvents runs the command against an endpoint found through CONTAINER_RUNTIME_ENDPOINT where
// nothing serves: it fails, naming the endpoint (the printing is eventprint's, tested there).
func TestRunEvents(t *testing.T) {
	sock := "unix://" + filepath.Join(t.TempDir(), "cri.sock")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := runEvents(ctx, []string{"-o", "json"}, endpointEnv(sock), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), sock) {
		t.Errorf("error %v, want one naming %s", err, sock)
	}
}
