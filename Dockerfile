# Builds the single binary; the image runs `api serve` by default.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# GOWORK=off: the image builds the service module alone, not the harness
# modules that go.work adds for development.
RUN CGO_ENABLED=0 GOWORK=off go build -trimpath -o /out/api ./cmd/api

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/api /api
EXPOSE 8080 9090
ENTRYPOINT ["/api"]
CMD ["serve"]
