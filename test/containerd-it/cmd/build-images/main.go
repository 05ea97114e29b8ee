// Command build-images builds the test images (pause, busybox) as OCI archives in the dependency cache
// and prints their paths, one per line: the same archives the harness imports (harness.BuildImages),
// for the scripts that build container images offline (test/kind/node-image.sh).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

func main() {
	cache := os.Getenv("PLEG_NRI_CACHE")
	if cache == "" {
		cache = harness.DefaultCache
	}
	archives, err := harness.BuildImages(context.Background(), cache)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build-images:", err)
		os.Exit(1)
	}
	for _, a := range archives {
		fmt.Println(a)
	}
}
