package testutil

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestServeVersionRuntime(t *testing.T) {
	sock := filepath.Join(ShortTempDir(t, "tu-"), "cri.sock")
	ServeVersionRuntime(t, sock, "fake")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	v, err := client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || v.GetRuntimeName() != "fake" || v.GetVersion() != "0.1.0" {
		t.Errorf("Version: %v, %v; want runtime fake, version 0.1.0", v, err)
	}
	if _, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err == nil {
		t.Error("ListContainers answered, want Unimplemented")
	}
}

func TestServeReadyz(t *testing.T) {
	r := ServeReadyz(t)
	get := func(wantCode int, wantBody string) {
		t.Helper()
		resp, err := http.Get(r.URL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != wantCode || string(body) != wantBody {
			t.Errorf("GET %s: %d %q, want %d %q", r.URL, resp.StatusCode, body, wantCode, wantBody)
		}
	}
	get(http.StatusOK, "ok\n")
	r.Fail("not yet")
	get(http.StatusServiceUnavailable, "not yet\n")
	r.Fail("")
	get(http.StatusOK, "ok\n")
}
