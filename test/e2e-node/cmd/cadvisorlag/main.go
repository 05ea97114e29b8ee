// Command cadvisorlag reads kubelet logs (klog at -v=3 or more, as make e2e-node writes them) and says,
// for each, how far the kubelet's cAdvisor lagged behind the pods and containers the kubelet created
// and stopped (see package test/cadvisorlag): the pods the kubelet synced for the first time and the
// containers it created, to cAdvisor adding them; the kubelet's own stops, to cAdvisor destroying the
// container, and how many only after the stop returned (each as n, p50, p90 and largest time); and how
// many resize checks could not read the pod's memory usage. With more than one log, a last line says the
// same of them all together. make e2e-node records the same for each run in its report.
//
// Usage: cadvisorlag kubelet.log...
package main

import (
	"fmt"
	"os"

	"github.com/pleg-nri/pleg-nri/test/cadvisorlag"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cadvisorlag kubelet.log...")
		os.Exit(2)
	}
	var all cadvisorlag.Lags
	for _, path := range os.Args[1:] {
		l, err := cadvisorlag.ReadFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cadvisorlag: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("%s: %s\n", path, l)
		all.Add(l)
	}
	if len(os.Args) > 2 {
		fmt.Printf("all %d logs: %s\n", len(os.Args)-1, all)
	}
}
