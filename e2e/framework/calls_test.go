package framework

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCallsInFlight(t *testing.T) {
	log := filepath.Join(t.TempDir(), "driver.log")
	const publish = "/csi.v1.Controller/ControllerPublishVolume"
	if err := os.WriteFile(log, []byte(`I1125 19:41:10.968732   11562 server.go:74] "request" method="/csi.v1.Controller/ControllerPublishVolume" id=12 request="{\"node_id\":\"node-a\"}"
I1125 19:41:10.968800   11562 server.go:74] "request" method="/csi.v1.Controller/ControllerPublishVolume" id=13 request="{}"
I1125 19:41:10.968900   11562 server.go:74] "request" method="/csi.v1.Controller/ControllerUnpublishVolume" id=14 request="{}"
I1125 19:41:10.968950   11562 server.go:74] "request" method="/csi.v1.Controller/ControllerPublishVolume" id=15 request="{}"
I1125 19:41:10.993620   11562 storagefence.go:177] "storage fencing: export changed" method="/csi.v1.Controller/ControllerPublishVolume" id=12 volume="pvc-1"
I1125 19:41:10.998367   11562 server.go:80] "response" method="/csi.v1.Controller/ControllerPublishVolume" id=12 response="{}" duration="29.8ms"
E1125 19:41:11.246269   11562 server.go:78] "failed" err="rpc error: code = Unavailable desc = volume pvc-1: exporting disk \"pvc-1\": method=\"x\" id=15" method="/csi.v1.Controller/ControllerPublishVolume" id=13 duration="13.2s"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := CallsInFlight(log, publish)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{15}; !slices.Equal(got, want) {
		t.Errorf("publishes in flight %v, want %v", got, want)
	}
	got, _ = CallsInFlight(log, "/csi.v1.Controller/ControllerUnpublishVolume")
	if want := []int{14}; !slices.Equal(got, want) {
		t.Errorf("unpublishes in flight %v, want %v", got, want)
	}
}
