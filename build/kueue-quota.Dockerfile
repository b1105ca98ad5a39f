# The Kueue quota follower (pure Go, static; manifests/components/kueue deploys it), for
# users who build with Docker:
#   docker build -f build/kueue-quota.Dockerfile -t understory/kueue-quota:$(cat VERSION) .
# The same image as `make images` writes to bin/images/kueue-quota.tar (images/,
# cmd/mkimage): /kueue-quota as the numeric non-root user 65532.
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/kueue-quota ./cmd/kueue-quota

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kueue-quota /kueue-quota
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/kueue-quota"]
