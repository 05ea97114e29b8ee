package fresh

import (
	"testing"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
)

// mustHooks is Hooks, failing t on an error; the hooks' own calls end with the test.
func mustHooks(t *testing.T, cfg Config) []kubelet.ReadHook {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	cfg.Done = done
	hooks, err := Hooks(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return hooks
}

// hookOf returns the hook of type H among hooks (the zero H when there is none).
func hookOf[H kubelet.ReadHook](hooks []kubelet.ReadHook) H {
	for _, h := range hooks {
		if h, ok := h.(H); ok {
			return h
		}
	}
	var none H
	return none
}
