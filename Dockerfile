# syntax=docker/dockerfile:1
# Multi-stage: a static binary on a distroless base, running as non-root.
# A release image carries its version and commit, and is tagged by version:
#   docker build --build-arg VERSION=v1.2.3 --build-arg COMMIT=$(git rev-parse HEAD) -t outboxd:v1.2.3 .
# (scripts/release.sh v1.2.3 --image does this; its binaries use the same flags).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
      -ldflags "-s -w -buildid= -X github.com/outboxd/outboxd/internal/buildinfo.version=${VERSION} -X github.com/outboxd/outboxd/internal/buildinfo.commit=${COMMIT}" \
      -o /out/outboxd ./cmd/outboxd \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/outboxd-demo ./cmd/outboxd-demo

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="outboxd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
COPY --from=build /out/outboxd /out/outboxd-demo /usr/local/bin/
COPY config.yaml /etc/outboxd/config.yaml
USER 65532:65532
EXPOSE 9090
# `outboxd health` GETs /readyz on http.addr (127.0.0.1 for a wildcard host):
# exit 0 when Postgres and Redis answer. Exec form: the image has no shell.
# It reads the same config file and OUTBOXD_* environment as `run`.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/outboxd", "health", "--config", "/etc/outboxd/config.yaml"]
ENTRYPOINT ["/usr/local/bin/outboxd"]
CMD ["run", "--config", "/etc/outboxd/config.yaml"]
