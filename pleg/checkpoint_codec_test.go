package pleg

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/internal/testutil"
	"github.com/pleg-nri/pleg-nri/pleg/internal/checkpointpb"
)

// goldenCheckpointFile was written from goldenCheckpoint by the hand-written encoder pleg-nri had
// before the generated one (commit b6b264c): it stands for the checkpoints already on the nodes, which
// an upgraded pleg-nri must read. Never regenerate it.
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

// TestCheckpointEncodingCompatible: the encoder writes the payload the first encoder wrote (the same
// message; proto3 leaves out the fields that are zero, which every reader takes as zero), and what it
// writes decodes into what it was given.
func TestCheckpointEncodingCompatible(t *testing.T) {
	golden, err := os.ReadFile(filepath.FromSlash(goldenCheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	data, _, err := encodeCheckpoint(goldenCheckpoint(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[:12], golden[:12]) {
		t.Errorf("header % x, the first encoder wrote % x", data[:12], golden[:12])
	}
	var was, now checkpointpb.Checkpoint
	if err := proto.Unmarshal(golden[checkpointHeader:], &was); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(data[checkpointHeader:], &now); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&was, &now, protocmp.Transform()); d != "" {
		t.Errorf("payload (-first encoder +this one):\n%s", d)
	}
	got, err := decodeCheckpoint(data)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(goldenCheckpoint(), got, cmp.AllowUnexported(checkpoint{}, ckptPod{}, ckptObject{}), protocmp.Transform()); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}

// frameCheckpoint puts a payload behind a valid header: magic, version, CRC.
func frameCheckpoint(body []byte) []byte {
	data := make([]byte, checkpointHeader, checkpointHeader+len(body))
	copy(data, checkpointMagic)
	binary.LittleEndian.PutUint32(data[8:], checkpointVersion)
	data = append(data, body...)
	binary.LittleEndian.PutUint32(data[12:], crc32.Checksum(body, crcTable))
	return data
}

// TestCheckpointDecodeRejects: a payload that is valid protobuf but not a consistent checkpoint is an
// error, never a state.
func TestCheckpointDecodeRejects(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		mod        func(c *checkpointpb.Checkpoint)
	}{
		{"not protobuf", "checkpoint: ", nil},
		{"phase out of range", "with phase 4", func(c *checkpointpb.Checkpoint) { c.Pods[0].Containers[1].Phase = 4 }},
		{"no phase", "ctr-running without a phase", func(c *checkpointpb.Checkpoint) { c.Pods[0].Containers[1].Phase = 0 }},
		{"no id", "without an id", func(c *checkpointpb.Checkpoint) { c.Pods[0].Containers[1].Id = "" }},
		{"no status", "ctr-running without a status", func(c *checkpointpb.Checkpoint) { c.Pods[0].Containers[1].Status = nil }},
		{"bad status", "ctr-running: bad status", func(c *checkpointpb.Checkpoint) { c.Pods[0].Containers[1].Status = []byte{0xff} }},
		{"status of another container", `ctr-running: its status is of "ctr-exited"`, func(c *checkpointpb.Checkpoint) {
			c.Pods[0].Containers[1].Status = c.Pods[0].Containers[2].Status
		}},
		{"sandbox status of another sandbox", `sandbox-a: its status is of "sandbox-b"`, func(c *checkpointpb.Checkpoint) {
			c.Pods[0].Sandbox.Status = c.Pods[1].Sandbox.Status
		}},
		{"sandbox status without metadata", "sandbox-a: its status is of \"sandbox-a\" or has no metadata", func(c *checkpointpb.Checkpoint) {
			c.Pods[0].Sandbox.Status, _ = proto.Marshal(&runtimeapi.PodSandboxStatus{Id: "sandbox-a"})
		}},
		{"no sandbox", `pod "sandbox-a" without its sandbox`, func(c *checkpointpb.Checkpoint) { c.Pods[0].Sandbox = nil }},
		{"another pod's sandbox", `pod "sandbox-a" without its sandbox`, func(c *checkpointpb.Checkpoint) { c.Pods[0].Sandbox = c.Pods[1].Sandbox }},
		{"no pod id", `pod "" without its sandbox`, func(c *checkpointpb.Checkpoint) { c.Pods[0].Id = "" }},
		{"container twice", `object "ctr-failed" listed twice`, func(c *checkpointpb.Checkpoint) {
			c.Pods[1].Containers = append(c.Pods[1].Containers, c.Pods[1].Containers[0])
		}},
		{"container in two pods", `object "ctr-running" listed twice`, func(c *checkpointpb.Checkpoint) {
			c.Pods[1].Containers = append(c.Pods[1].Containers, c.Pods[0].Containers[1])
		}},
		{"pod twice", `object "sandbox-b" listed twice`, func(c *checkpointpb.Checkpoint) { c.Pods = append(c.Pods, c.Pods[1]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte("\xff\xff\xff")
			if tc.mod != nil {
				data, _, err := encodeCheckpoint(goldenCheckpoint(), nil)
				if err != nil {
					t.Fatal(err)
				}
				var c checkpointpb.Checkpoint
				if err := proto.Unmarshal(data[checkpointHeader:], &c); err != nil {
					t.Fatal(err)
				}
				tc.mod(&c)
				if body, err = proto.Marshal(&c); err != nil {
					t.Fatal(err)
				}
			}
			c, err := decodeCheckpoint(frameCheckpoint(body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decoded %v, %v; want an error with %q", c, err, tc.want)
			}
		})
	}
}

// FuzzCheckpointDecode: whatever the file holds, decoding never panics, and what decodes restores.
func FuzzCheckpointDecode(f *testing.F) {
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(f, cri, clock, filepath.Join(f.TempDir(), "checkpoint"))
	h.startPod("s1", "c1", "c2")
	h.startPod("s2")
	valid, err := h.p.checkpointBytes()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	if golden, err := os.ReadFile(filepath.FromSlash(goldenCheckpointFile)); err == nil {
		f.Add(golden)
	}
	f.Add(valid[:checkpointHeader])
	f.Add([]byte(checkpointMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := decodeCheckpoint(data)
		if err != nil {
			return
		}
		st := newState(testutil.NewClock().Now, NopMetrics{}, newFetcher(testutil.NewClock().Now), newFanout(4, NopMetrics{}), -1)
		if n := st.restore(c); n != c.objects() || n != len(st.objects) {
			t.Fatalf("restored %d objects of %d", n, c.objects())
		}
	})
}

// FuzzCheckpointBody: mutations of a valid body, with a valid CRC so they reach the decoder.
func FuzzCheckpointBody(f *testing.F) {
	clock, cri := testutil.NewClock(), newFakeCRI()
	h, _ := newProcess(f, cri, clock, filepath.Join(f.TempDir(), "checkpoint"))
	h.startPod("s1", "c1", "c2")
	valid, err := h.p.checkpointBytes()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid[checkpointHeader:])
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := decodeCheckpoint(frameCheckpoint(body))
		if err != nil {
			return
		}
		st := newState(testutil.NewClock().Now, NopMetrics{}, newFetcher(testutil.NewClock().Now), newFanout(4, NopMetrics{}), -1)
		if n := st.restore(c); n != len(st.objects) {
			t.Fatalf("restored %d objects, %d in the state", n, len(st.objects))
		}
	})
}
