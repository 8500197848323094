// Package csi is the driver's gRPC face: the CSI Identity, Controller and
// Node services, the server that hosts them, and the one place where
// internal errors become gRPC status codes.
//
// It declares what it needs from the RDS client, the NVMe connector and the
// publish policy as small interfaces, so each RPC is tested against fakes and
// against the real simulator alike. It must never log secrets or unsanitized
// requests, never hand a value to the RDS layer that it has not validated,
// and never leave a half-created volume behind a failed RPC.
package csi
