# The kube-scheduler extender (pure Go, static), for users who build with Docker:
#   docker build -f build/scheduler-extender.Dockerfile -t understory/scheduler-extender:$(cat VERSION) .
# The same image as `make images` writes to bin/images/scheduler-extender.tar (images/,
# cmd/mkimage): /scheduler-extender as the numeric non-root user 65532.
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/scheduler-extender ./cmd/scheduler-extender

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/scheduler-extender /scheduler-extender
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/scheduler-extender"]
