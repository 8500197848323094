module github.com/srvlab/rds-csi

go 1.26.0

require (
	github.com/go-logr/logr v1.4.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
