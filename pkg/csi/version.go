package csi

// Version is set at build time with -ldflags "-X .../pkg/csi.Version=...".
var Version = "dev"
