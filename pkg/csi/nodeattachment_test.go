package csi

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NodeStageVolume connects as the attachment's own host when
// publish_context names one (storage fencing), as the node when it names
// none (an attachment from before per-attachment host NQNs, or fencing
// off), and refuses a malformed one before anything is connected. A raw
// block stage goes no further than the connect, so this needs no root.
func TestNodeStageAttachmentHost(t *testing.T) {
	const (
		vol      = "pvc-8d2f6a1e-3c4b-4e5d-9f60-7a8b9c0d1e2f"
		attachA  = "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e"
		attachNm = "nqn.2024-01.lan.example:attachment-7"
	)
	for _, tc := range []struct {
		name     string
		publish  map[string]string
		volume   map[string]string
		wantHost string
		wantErr  string // part of an InvalidArgument message; "" = success
	}{
		{name: "no host NQN: the node's own", wantHost: ""},
		{name: "the attachment's host NQN", publish: map[string]string{PublishContextHostNQN: attachA}, wantHost: attachA},
		{name: "a host NQN in another form", publish: map[string]string{PublishContextHostNQN: attachNm}, wantHost: attachNm},
		{name: "only in the volume_context: not the attachment's", volume: map[string]string{PublishContextHostNQN: attachA}, wantHost: ""},
		{name: "malformed", publish: map[string]string{PublishContextHostNQN: attachA + ",hostid=x"}, wantErr: "not an NVMe qualified name"},
		{name: "empty", publish: map[string]string{PublishContextHostNQN: ""}, wantErr: "empty"},
		{name: "UUID form without a UUID", publish: map[string]string{PublishContextHostNQN: "nqn.2014-08.org.nvmexpress:uuid:worker-1"}, wantErr: "no UUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &recordingConnector{dev: "/dev/nvme0n1"}
			ns := nodeInfoServer(t, rc)
			vc := map[string]string{VolumeContextNVMeAddress: "10.0.0.5"}
			for k, v := range tc.volume {
				vc[k] = v
			}
			_, err := ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
				VolumeId: vol, StagingTargetPath: t.TempDir(), VolumeCapability: blockCapability(sw),
				VolumeContext: vc, PublishContext: tc.publish,
			})
			got := rc.connected()
			if tc.wantErr != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), vol) {
					t.Fatalf("NodeStageVolume = %v, want InvalidArgument naming %s and saying %q", err, vol, tc.wantErr)
				}
				if v := tc.publish[PublishContextHostNQN]; v != "" && strings.Contains(err.Error(), v) {
					t.Errorf("the error %q quotes the host NQN", err)
				}
				if len(got) != 0 {
					t.Errorf("connected %+v after refusing the request", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].HostNQN != tc.wantHost || got[0].NQN != testNQNPrefix+vol || got[0].Address != "10.0.0.5" {
				t.Errorf("connected %+v, want %s as host %q", got, testNQNPrefix+vol, tc.wantHost)
			}
		})
	}
}
