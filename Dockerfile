# The image of rds-csi-driver, one for the controller and the node plugin:
#
#   docker build --build-arg VERSION=$(hack/version.sh) \
#     -t ghcr.io/srvlab/rds-csi-driver:$(hack/version.sh) .
#
# `make image` builds the same image without a container engine, from the
# same Debian packages and the Go build (hack/build-image.sh), as an OCI
# archive for docker load, ctr images import or kind load image-archive.
#
# The driver is static; beside it are the tools the node service runs:
# mkfs, fsck and resize for ext4 (e2fsprogs) and xfs (xfsprogs), blkid,
# blockdev, losetup, mount and umount (util-linux, mount), modprobe for
# nvme-tcp (kmod). The driver connects through /dev/nvme-fabrics itself;
# nvme-cli is there for operators (kubectl exec ... nvme list-subsys). The
# controller runs the image as user 65532 (manifests/base/controller.yaml)
# and needs none of the tools. See docs/deploy.md.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOOS=linux GOFLAGS="-trimpath -buildvcs=false" GOTOOLCHAIN=local
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN go build -ldflags "-s -w -X github.com/srvlab/rds-csi/pkg/version.Version=${VERSION}" \
      -o /out/rds-csi-driver ./cmd/rds-csi-driver

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      e2fsprogs xfsprogs util-linux mount kmod nvme-cli \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd -g 65532 nonroot && useradd -u 65532 -g 65532 -d /home/nonroot -m -s /bin/false nonroot
COPY --from=build /out/rds-csi-driver /rds-csi-driver
ENTRYPOINT ["/rds-csi-driver"]
