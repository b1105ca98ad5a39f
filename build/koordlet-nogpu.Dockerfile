# The node agent in pure Go (static, GPU features off), for users who build with Docker:
#   docker build -f build/koordlet-nogpu.Dockerfile -t understory/koordlet-nogpu:$(cat VERSION) .
# The same image as `make images` writes to bin/images/koordlet-nogpu.tar (images/,
# cmd/mkimage): /koordlet-nogpu as root (it writes cgroup files), no libc.
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/koordlet-nogpu ./cmd/koordlet

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/koordlet-nogpu /koordlet-nogpu
USER 0:0
WORKDIR /
ENTRYPOINT ["/koordlet-nogpu"]
