package pleg

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// goldenCheckpointFile was written by the pleg-nri of issue 15's start (its hand-written encoder) from
// goldenCheckpoint: it stands for the checkpoints already on the nodes, which an upgraded pleg-nri must
// read. Never regenerate it with a newer encoder.
const goldenCheckpointFile = "testdata/checkpoint-v1.bin"

// goldenCheckpoint is what goldenCheckpointFile holds: two pods, a sandbox ready and one not ready, and
// containers in every phase a checkpoint records, with every flag and a stopped reason.
func goldenCheckpoint() *checkpoint {
	const t0 = int64(1_700_000_000_000_000_000)
	sandbox := func(id string, state runtimeapi.PodSandboxState) *runtimeapi.PodSandboxStatus {
		return &runtimeapi.PodSandboxStatus{
			Id:        id,
			Metadata:  &runtimeapi.PodSandboxMetadata{Name: "pod-" + id, Uid: "uid-" + id, Namespace: "default"},
			State:     state,
			CreatedAt: t0,
			Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: "10.88.0.7"},
			Labels:    map[string]string{"app": "web"},
		}
	}
	container := func(id string, state runtimeapi.ContainerState, started, finished int64, code int32, reason string) *runtimeapi.ContainerStatus {
		return &runtimeapi.ContainerStatus{
			Id:         id,
			Metadata:   &runtimeapi.ContainerMetadata{Name: "ctr-" + id, Attempt: 1},
			State:      state,
			CreatedAt:  t0 + 1000,
			StartedAt:  started,
			FinishedAt: finished,
			ExitCode:   code,
			Reason:     reason,
			Image:      &runtimeapi.ImageSpec{Image: "registry.k8s.io/pause:3.10"},
			ImageRef:   "sha256:0123456789abcdef",
		}
	}
	return &checkpoint{
		scope:     testScope,
		writtenAt: t0 + int64(time.Minute),
		pods: []ckptPod{
			{
				id:        "sandbox-a",
				lastEvent: t0 + 5000,
				sandbox: ckptObject{id: "sandbox-a", phase: PhaseRunning, flags: ckptStarted, created: t0,
					sandbox: sandbox("sandbox-a", runtimeapi.PodSandboxState_SANDBOX_READY)},
				containers: []ckptObject{
					{id: "ctr-created", phase: PhaseCreated, created: t0 + 1000,
						container: container("ctr-created", runtimeapi.ContainerState_CONTAINER_CREATED, 0, 0, 0, "")},
					{id: "ctr-running", phase: PhaseRunning, flags: ckptStarted, created: t0 + 2000,
						container: container("ctr-running", runtimeapi.ContainerState_CONTAINER_RUNNING, t0+2500, 0, 0, "")},
					{id: "ctr-exited", phase: PhaseExited, flags: ckptStarted | ckptExited, created: t0 + 3000,
						stoppedReason: reasonCompleted,
						container:     container("ctr-exited", runtimeapi.ContainerState_CONTAINER_EXITED, t0+3500, t0+4000, 0, reasonCompleted)},
					{id: "ctr-oom", phase: PhaseExited, flags: ckptStarted | ckptExited | ckptCorrected, created: t0 + 3000,
						stoppedReason: reasonOOMKilled,
						container:     container("ctr-oom", runtimeapi.ContainerState_CONTAINER_EXITED, t0+3500, t0+4500, oomExitCode, reasonOOMKilled)},
				},
			},
			{
				id:        "sandbox-b",
				lastEvent: t0 + 9000,
				sandbox: ckptObject{id: "sandbox-b", phase: PhaseExited, flags: ckptStarted | ckptExited, created: t0 + 100,
					sandbox: sandbox("sandbox-b", runtimeapi.PodSandboxState_SANDBOX_NOTREADY)},
				containers: []ckptObject{
					{id: "ctr-failed", phase: PhaseExited, flags: ckptStarted | ckptExited, created: t0 + 6000,
						stoppedReason: reasonError,
						container:     container("ctr-failed", runtimeapi.ContainerState_CONTAINER_EXITED, t0+6500, t0+7000, 1, reasonError)},
				},
			},
		},
	}
}

// TestWriteGoldenCheckpoint writes goldenCheckpointFile (PLEG_NRI_WRITE_GOLDEN=1): only the encoder it
// was first written with may do so.
func TestWriteGoldenCheckpoint(t *testing.T) {
	if os.Getenv("PLEG_NRI_WRITE_GOLDEN") == "" {
		t.Skip("PLEG_NRI_WRITE_GOLDEN is not set")
	}
	data, _, err := encodeCheckpoint(goldenCheckpoint(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.FromSlash(goldenCheckpointFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenCheckpoint: a checkpoint written by an earlier pleg-nri (the same format version) decodes
// into exactly the objects it was written from.
func TestGoldenCheckpoint(t *testing.T) {
	data, err := os.ReadFile(filepath.FromSlash(goldenCheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeCheckpoint(data)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(goldenCheckpoint(), got, cmp.AllowUnexported(checkpoint{}, ckptPod{}, ckptObject{}), protocmp.Transform()); d != "" {
		t.Fatalf("golden checkpoint (-want +got):\n%s", d)
	}
	pub, err := ReadCheckpoint(filepath.FromSlash(goldenCheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	want := &Checkpoint{Scope: testScope, WrittenAt: time.Unix(0, goldenCheckpoint().writtenAt), Objects: []CheckpointObject{
		{ID: "sandbox-a", SandboxID: "sandbox-a", Kind: KindSandbox, Phase: PhaseRunning},
		{ID: "ctr-created", SandboxID: "sandbox-a", Kind: KindContainer, Phase: PhaseCreated},
		{ID: "ctr-running", SandboxID: "sandbox-a", Kind: KindContainer, Phase: PhaseRunning},
		{ID: "ctr-exited", SandboxID: "sandbox-a", Kind: KindContainer, Phase: PhaseExited},
		{ID: "ctr-oom", SandboxID: "sandbox-a", Kind: KindContainer, Phase: PhaseExited},
		{ID: "sandbox-b", SandboxID: "sandbox-b", Kind: KindSandbox, Phase: PhaseExited},
		{ID: "ctr-failed", SandboxID: "sandbox-b", Kind: KindContainer, Phase: PhaseExited},
	}}
	if d := cmp.Diff(want, pub); d != "" {
		t.Errorf("ReadCheckpoint of the golden checkpoint (-want +got):\n%s", d)
	}
}
