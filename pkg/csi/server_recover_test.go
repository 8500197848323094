package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// panickyIdentity panics in GetPluginInfo.
type panickyIdentity struct {
	csi.UnimplementedIdentityServer
}

func (panickyIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	var m map[string]int
	m["boom"]++ // a nil-map write: a driver bug
	return nil, nil
}

func (panickyIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// TestServerRecoversPanics: a panic in one call is INTERNAL for that call;
// the server keeps serving.
func TestServerRecoversPanics(t *testing.T) {
	srv := NewGRPCServer(panickyIdentity{}, nil, nil)
	lis, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := csi.NewIdentityClient(conn)
	if _, err := c.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{}); code(err) != codes.Internal {
		t.Fatalf("panicking call: %v, want INTERNAL", err)
	}
	if _, err := c.Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("the next call: %v", err)
	}
}
