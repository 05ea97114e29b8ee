package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// eventLine is one event as `pleg-nri events` prints it.
type eventLine struct {
	// Time is the event's created_at.
	Time time.Time `json:"time"`
	Type string    `json:"type"`
	// Pod is namespace/name; PodUID its uid.
	Pod    string `json:"pod"`
	PodUID string `json:"pod_uid"`
	// Container is the container's name, or "(sandbox)" for a sandbox event; ID the container or
	// sandbox id.
	Container string `json:"container"`
	ID        string `json:"id"`
	// State is the container's (or the sandbox's) state in the event's statuses.
	State    string `json:"state"`
	ExitCode *int32 `json:"exit_code,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Containers is how many container statuses the event carries.
	Containers int `json:"containers"`
	// LatencyMS is the time from the event's created_at to its receipt here.
	LatencyMS float64 `json:"latency_ms"`
}

// toEventLine summarizes an event received at recv.
func toEventLine(ev *runtimeapi.ContainerEventResponse, recv time.Time) eventLine {
	l := eventLine{
		Time:       time.Unix(0, ev.CreatedAt),
		Type:       strings.TrimSuffix(strings.TrimPrefix(ev.ContainerEventType.String(), "CONTAINER_"), "_EVENT"),
		ID:         ev.ContainerId,
		Containers: len(ev.ContainersStatuses),
		LatencyMS:  float64(recv.UnixNano()-ev.CreatedAt) / 1e6,
	}
	if ps := ev.PodSandboxStatus; ps != nil {
		l.Pod = ps.GetMetadata().GetNamespace() + "/" + ps.GetMetadata().GetName()
		l.PodUID = ps.GetMetadata().GetUid()
		if ps.Id == ev.ContainerId {
			l.Container = "(sandbox)"
			l.State = strings.TrimPrefix(ps.State.String(), "SANDBOX_")
		}
	} else {
		l.Pod = "(no pod status)"
	}
	for _, cs := range ev.ContainersStatuses {
		if cs.Id != ev.ContainerId {
			continue
		}
		l.Container = cs.GetMetadata().GetName()
		l.State = strings.TrimPrefix(cs.State.String(), "CONTAINER_")
		if cs.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			code := cs.ExitCode
			l.ExitCode = &code
			l.Reason = cs.Reason
		}
	}
	if l.Container == "" {
		l.Container = "(gone)"
	}
	return l
}

// runEvents is `pleg-nri events`: print a CRI endpoint's event stream until interrupted.
func runEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pleg-nri events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", DefaultConfig().Listen, "CRI endpoint whose GetContainerEvents stream to print (pleg-nri's or containerd's)")
	output := fs.String("output", "text", "output format: text or json (one object per line)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("--output: want text or json, got %q", *output)
	}
	target, err := grpcTarget(*endpoint)
	if err != nil {
		return fmt.Errorf("--endpoint: %w", err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return fmt.Errorf("failed to connect to %s: %w", *endpoint, err)
	}
	defer conn.Close()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return fmt.Errorf("GetContainerEvents on %s: %w", *endpoint, err)
	}
	var tw *tabwriter.Writer
	if *output == "text" {
		tw = tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tTYPE\tPOD\tCONTAINER\tID\tSTATE\tEXIT\tREASON\tLATENCY")
		tw.Flush()
	}
	enc := json.NewEncoder(stdout)
	for {
		ev, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || status.Code(err) == codes.Canceled {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s closed the event stream", *endpoint)
			}
			return fmt.Errorf("event stream from %s: %w", *endpoint, err)
		}
		l := toEventLine(ev, time.Now())
		if tw == nil {
			if err := enc.Encode(l); err != nil {
				return err
			}
			continue
		}
		exit := ""
		if l.ExitCode != nil {
			exit = fmt.Sprint(*l.ExitCode)
		}
		id := l.ID
		if len(id) > 13 {
			id = id[:13]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2fms\n", l.Time.Format("15:04:05.000000"), l.Type, l.Pod,
			l.Container, id, l.State, exit, l.Reason, l.LatencyMS)
		tw.Flush()
	}
}

// grpcTarget turns a CRI endpoint (unix:///path, /path, tcp://host:port) into a gRPC target.
func grpcTarget(endpoint string) (string, error) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		return endpoint, nil
	case strings.HasPrefix(endpoint, "/"):
		return "unix://" + endpoint, nil
	case strings.HasPrefix(endpoint, "tcp://"):
		return "dns:///" + strings.TrimPrefix(endpoint, "tcp://"), nil
	}
	return "", fmt.Errorf("want unix:///path, /path or tcp://host:port, got %q", endpoint)
}
