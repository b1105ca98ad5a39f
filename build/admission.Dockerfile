# The admission webhook (pure Go, static), for users who build with Docker:
#   docker build -f build/admission.Dockerfile -t understory/admission:$(cat VERSION) .
# The same image as `make images` writes to bin/images/admission.tar (images/,
# cmd/mkimage): /admission as the numeric non-root user 65532.
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/admission ./cmd/admission

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/admission /admission
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/admission"]
