# The node agent built with cgo (NVML), for users who build with Docker:
#   docker build -f build/koordlet.Dockerfile -t understory/koordlet:$(cat VERSION) .
# The same image as `make images` writes to bin/images/koordlet.tar (images/, cmd/mkimage):
# /koordlet as root (it writes cgroup files), glibc from Debian 12, and the GPU time-slice
# shim at /usr/lib/understory/libunderstory-tsg.so (built as `make tsg-shim` builds it; the
# agent copies it to the host with gpu.timeslice on). libnvidia-ml.so.1 is not in the
# image: the node provides it (NVIDIA Container Toolkit), or GPU features stay off.
# The builder's Debian and the final stage's must be the same release (glibc).
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN gcc -shared -fPIC -O2 -Wall -Wextra -o /out/libunderstory-tsg.so \
    koordlet/gpu/timeslice/shim/understory_tsg.c -Wl,--no-as-needed -l:libdl.so.2
RUN CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
    go build -trimpath -buildvcs=false -o /out/koordlet ./cmd/koordlet

FROM gcr.io/distroless/base-nossl-debian12
COPY --from=build /out/libunderstory-tsg.so /usr/lib/understory/libunderstory-tsg.so
COPY --from=build /out/koordlet /koordlet
USER 0:0
WORKDIR /
ENTRYPOINT ["/koordlet"]
