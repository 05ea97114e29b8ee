package config

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
)

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       func(*Config)
		wantErr    string
	}{
		{name: "empty", data: "", want: func(*Config) {}},
		{name: "comment only", data: "# nothing\n", want: func(*Config) {}},
		{name: "keys", data: "relist-period: 3s\nlisten: unix:///tmp/x.sock\nsubscriber-queue: 10\nmetrics-address: \"\"\n",
			want: func(c *Config) {
				c.RelistPeriod = Duration(3 * time.Second)
				c.Listen = "unix:///tmp/x.sock"
				c.SubscriberQueue = 10
				c.MetricsAddress = ""
			}},
		{name: "unknown key", data: "relist_period: 3s\n", wantErr: `unknown config key "relist_period"`},
		{name: "bad duration", data: "relist-period: often\n", wantErr: `config key "relist-period"`},
		{name: "number as duration", data: "relist-period: 10\n", wantErr: `config key "relist-period"`},
		{name: "negative duration", data: "relist-period: -1s\n", wantErr: `config key "relist-period": must be a positive duration`},
		{name: "negative size", data: "subscriber-queue: -5\n", wantErr: `config key "subscriber-queue": must be at least 1`},
		{name: "wrong type", data: "subscriber-queue: lots\n", wantErr: `config key "subscriber-queue": want a int, got a string`},
		{name: "bad level", data: "log-level: loud\n", wantErr: `config key "log-level"`},
		{name: "bad index", data: "plugin-idx: \"7\"\n", wantErr: `config key "plugin-idx": must be two digits`},
		{name: "bad endpoint", data: "listen: http://x\n", wantErr: `config key "listen"`},
		{name: "tcp listen", data: "listen: tcp://127.0.0.1:9000\n", wantErr: `config key "listen": a TCP endpoint (tcp://127.0.0.1:9000) is refused unless allow-tcp-listen is true: it has no authentication`},
		{name: "tcp listen allowed", data: "listen: tcp://127.0.0.1:9000\nallow-tcp-listen: true\n", want: func(c *Config) {
			c.Listen, c.AllowTCPListen = "tcp://127.0.0.1:9000", true
		}},
		{name: "not a mapping", data: "- a\n- b\n", wantErr: "want a mapping"},
		{name: "bad yaml", data: "a: [\n", wantErr: "invalid config"},
		{name: "state", data: "state-dir: /srv/pleg\nstartup-replay: 0s\n", want: func(c *Config) {
			c.StateDir = "/srv/pleg"
			c.StartupReplay = 0
		}},
		{name: "no state", data: "state-dir: \"\"\n", want: func(c *Config) { c.StateDir = "" }},
		{name: "relative state dir", data: "state-dir: state\n", wantErr: `config key "state-dir": must be an absolute path`},
		{name: "negative replay", data: "startup-replay: -1m\n", wantErr: `config key "startup-replay": must not be negative`},
		{name: "read freshness", data: "read-freshness: \"off\"\n", want: func(c *Config) { c.ReadFreshness = "off" }},
		{name: "bad read freshness", data: "read-freshness: fast\n", wantErr: `config key "read-freshness": want overlay or off`},
		{name: "checkpoint interval", data: "checkpoint-interval: 250ms\n", want: func(c *Config) { c.CheckpointInterval = Duration(250 * time.Millisecond) }},
		{name: "core grace", data: "core-grace: 5s\n", want: func(c *Config) { c.CoreGrace = Duration(5 * time.Second) }},
		{name: "no core grace", data: "core-grace: 0s\n", want: func(c *Config) { c.CoreGrace = 0 }},
		{name: "core grace too short", data: "core-grace: 500ms\n", wantErr: `config key "core-grace": must be 0 (off) or at least 1s`},
		{name: "negative core grace", data: "core-grace: -1s\n", wantErr: `config key "core-grace": must be 0 (off) or at least 1s`},
		{name: "checkpoint interval too short", data: "checkpoint-interval: 1ms\n", wantErr: `config key "checkpoint-interval": must be at least 10ms`},
		{name: "stall timeout", data: "subscriber-stall-timeout: 45s\n", want: func(c *Config) { c.SubscriberStallTimeout = Duration(45 * time.Second) }},
		{name: "no stall timeout", data: "subscriber-stall-timeout: 0s\n", want: func(c *Config) { c.SubscriberStallTimeout = 0 }},
		{name: "stall timeout too short", data: "subscriber-stall-timeout: 100ms\n", wantErr: `config key "subscriber-stall-timeout": must be 0 (off) or at least 1s`},
		{name: "negative stall timeout", data: "subscriber-stall-timeout: -1m\n", wantErr: `config key "subscriber-stall-timeout"`},
		// A retired key is read and ignored, whatever its value, not refused (TestRetiredKeyWarns).
		{name: "retired read-source", data: "read-source: state\nrelist-period: 3s\n", want: func(c *Config) { c.RelistPeriod = Duration(3 * time.Second) }},
		{name: "retired read-source of another type", data: "read-source: 1\n", want: func(*Config) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.data), Default())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			tc.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadConfigFlagsOverrideFile checks the order: defaults, then the file, then explicit flags.

// TestRetiredKeyWarns: a retired key is not a key any more (Keys, Fields), and a config that sets one
// gets a warning naming it and what replaces it.
func TestRetiredKeyWarns(t *testing.T) {
	buf := testutil.CaptureLog(t)
	for key := range Retired {
		if slices.Contains(Keys(), key) {
			t.Errorf("retired key %q is still a key", key)
		}
		if _, err := Parse([]byte(key+": x\n"), Default()); err != nil {
			t.Errorf("a config setting the retired key %q: %v", key, err)
		}
		if out := buf.String(); !strings.Contains(out, "retired") || !strings.Contains(out, key) || !strings.Contains(out, "Retired keys") {
			t.Errorf("the warning for %q: %q, want it to name the key and the operations guide's Retired keys", key, out)
		}
		buf.Reset()
	}
	if _, ok := Retired["read-source"]; !ok {
		t.Error("read-source is not in Retired")
	}
}

// TestRetiredValueReplaced: a retired value (read-freshness: hold) is replaced by the one that took its
// place, with a warning naming the key, the value and the operations guide's Retired keys, in a file and
// in the flags (ReplaceRetired), and the key's other values stay as they are.
func TestRetiredValueReplaced(t *testing.T) {
	buf := testutil.CaptureLog(t)
	base := Default()
	base.ReadFreshness = "off"
	got, err := Parse([]byte("read-freshness: hold\n"), base)
	if err != nil || got.ReadFreshness != "overlay" {
		t.Errorf("read-freshness: hold gave %q, %v; want overlay", got.ReadFreshness, err)
	}
	if out := buf.String(); !strings.Contains(out, "retired") || !strings.Contains(out, "hold") || !strings.Contains(out, "Retired keys") {
		t.Errorf("the warning: %q, want it to name the value and the operations guide's Retired keys", out)
	}
	flags := Default()
	flags.ReadFreshness = "hold"
	ReplaceRetired(&flags)
	if flags.ReadFreshness != "overlay" || flags.Validate() != nil {
		t.Errorf("ReplaceRetired left read-freshness %q (%v)", flags.ReadFreshness, flags.Validate())
	}
	if got, err := Parse([]byte("read-freshness: \"off\"\n"), Default()); err != nil || got.ReadFreshness != "off" {
		t.Errorf("read-freshness: off gave %q, %v", got.ReadFreshness, err)
	}
}

// TestLoad: the defaults, then the file, then the flags set (as the flag library gives their values:
// a time.Duration for a Duration key), each over the one before; a retired flag is ignored with its
// warning and a retired value replaced; an unreadable or bad file and an invalid result are errors.
func TestLoad(t *testing.T) {
	buf := testutil.CaptureLog(t)
	dir := t.TempDir()
	path := dir + "/config.yaml"
	if err := os.WriteFile(path, []byte("relist-period: 7s\nlog-level: debug\nsubscriber-queue: 64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := map[string]any{"log-level": "warn", "cache-tick": 2 * time.Second, "read-source": "state", "read-freshness": "hold"}
	flag := func(key string) (any, bool) { v, ok := flags[key]; return v, ok }
	got, err := Load(path, flag)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.RelistPeriod, want.SubscriberQueue = Duration(7*time.Second), 64
	want.LogLevel, want.CacheTick, want.ReadFreshness = "warn", Duration(2*time.Second), "overlay"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
	if out := buf.String(); !strings.Contains(out, "flag retired, ignored") || !strings.Contains(out, "--read-source") {
		t.Errorf("the retired flag's warning: %q", out)
	}
	if got, err := Load("", func(string) (any, bool) { return nil, false }); err != nil || !cmp.Equal(got, Default()) {
		t.Errorf("no file, no flags: %+v, %v; want the defaults", got, err)
	}
	if _, err := Load(dir+"/missing.yaml", flag); err == nil || !strings.Contains(err.Error(), "failed to read config") {
		t.Errorf("a missing file: %v", err)
	}
	bad := dir + "/bad.yaml"
	if err := os.WriteFile(bad, []byte("no-such-key: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad, flag); err == nil || !strings.HasPrefix(err.Error(), bad+": ") {
		t.Errorf("a bad file: %v, want an error naming it", err)
	}
	if _, err := Load("", func(key string) (any, bool) { return "", key == "listen" }); err == nil {
		t.Error("an empty listen: no error")
	}
}

// TestExampleConfig checks that nri.conf.example parses and documents every key with its default.
func TestExampleConfig(t *testing.T) {
	data, err := os.ReadFile("../../../../nri.conf.example")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(data, Config{})
	if err != nil {
		t.Fatalf("nri.conf.example: %v", err)
	}
	if diff := cmp.Diff(Default(), cfg); diff != "" {
		t.Errorf("nri.conf.example does not give every default (-defaults +example):\n%s", diff)
	}
}

// FuzzParseConfig: whatever the data, ParseConfig does not panic; an error says what is wrong in one of
// its forms (naming the key when a key is at fault); an accepted configuration is valid and reads back
// the same once written out.
func FuzzParseConfig(f *testing.F) {
	if example, err := os.ReadFile("../../../../nri.conf.example"); err == nil {
		f.Add(example)
	}
	for _, s := range []string{"", "relist-period: 3s\nsubscriber-queue: 10\n", "relist_period: 3s\n", "relist-period: -1s\n",
		"subscriber-queue: -5\n", "subscriber-queue: 1e3\n", "log-level: [a]\n", "listen: tcp://[::1]:1\n", "{\"listen\": 5}",
		"a: &x [1]\nb: *x\n", "- 1\n", "plugin-idx: 07\n", "metrics-address: ':'\n", "relist-period: 99999999999h\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, Default())
		if err != nil {
			msg := err.Error()
			for _, prefix := range []string{"config key \"", "unknown config key \"", "invalid config"} {
				if strings.HasPrefix(msg, prefix) {
					return
				}
			}
			t.Fatalf("error %q names no key", msg)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted an invalid configuration: %v", err)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal %+v: %v", cfg, err)
		}
		back, err := Parse(out, Config{})
		if err != nil {
			t.Fatalf("the configuration written out does not read back: %v\n%s", err, out)
		}
		if diff := cmp.Diff(cfg, back); diff != "" {
			t.Fatalf("read back differently (-accepted +read back):\n%s", diff)
		}
	})
}

func TestChangedKeys(t *testing.T) {
	a, b := Default(), Default()
	if got := ChangedKeys(a, b); len(got) != 0 {
		t.Errorf("ChangedKeys of equal configs = %v", got)
	}
	b.Listen, b.RelistPeriod, b.RefreshAfterStop = "/other.sock", Duration(time.Minute), true
	got := ChangedKeys(a, b)
	slices.Sort(got)
	if want := []string{"listen", "refresh-after-stop", "relist-period"}; !slices.Equal(got, want) {
		t.Errorf("ChangedKeys = %v, want %v", got, want)
	}
}

func TestRunDirectory(t *testing.T) {
	for _, tc := range []struct{ runDir, listen, want string }{
		{"/run/x", "unix:///run/pleg-nri/cri.sock", "/run/x"},
		{"", "unix:///run/pleg-nri/cri.sock", "/run/pleg-nri"},
		{"", "/var/run/p/cri.sock", "/var/run/p"},
		{"", "tcp://127.0.0.1:9000", "/run/pleg-nri"},
	} {
		if got := (Config{RunDir: tc.runDir, Listen: tc.listen}).RunDirectory(); got != tc.want {
			t.Errorf("RunDirectory(run-dir %q, listen %q) = %q, want %q", tc.runDir, tc.listen, got, tc.want)
		}
	}
}
