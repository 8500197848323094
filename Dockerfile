# Images of rds-csi-driver (one binary, two images):
#
#   docker build --target controller -t ghcr.io/srvlab/rds-csi-driver:v0.1.0 .
#   docker build --target node       -t ghcr.io/srvlab/rds-csi-driver-node:v0.1.0 .
#
# controller: the static binary on distroless, non-root; it needs nothing but
#             the network (SSH to the RDS, the API server).
# node:       the same binary with the tools the node service runs: mkfs,
#             fsck and resize for ext4 (e2fsprogs) and xfs (xfsprogs), blkid
#             and mount (util-linux, mount), modprobe for nvme-tcp (kmod).
#             The driver connects through /dev/nvme-fabrics itself; nvme-cli
#             is there for operators (kubectl exec ... nvme list-subsys).
# See docs/deploy.md.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOOS=linux GOFLAGS=-trimpath GOTOOLCHAIN=local
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN go build -ldflags "-s -w -X github.com/srvlab/rds-csi/pkg/csi.Version=${VERSION}" \
      -o /out/rds-csi-driver ./cmd/rds-csi-driver

FROM gcr.io/distroless/static-debian12:nonroot AS controller
COPY --from=build /out/rds-csi-driver /rds-csi-driver
USER 65532:65532
ENTRYPOINT ["/rds-csi-driver"]

FROM debian:bookworm-slim AS node
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      e2fsprogs xfsprogs util-linux mount kmod nvme-cli \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/rds-csi-driver /rds-csi-driver
ENTRYPOINT ["/rds-csi-driver"]
