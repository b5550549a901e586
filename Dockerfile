# fenceproxy image: the static part is small, but pg_query_go needs cgo, so build on the full Go image.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -trimpath -o /out/fenceproxy ./cmd/fenceproxy

FROM debian:bookworm-slim
# psql, so that the README's Docker steps (the story, and fenceproxy lock -- psql) run in this container.
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-client \
	&& rm -rf /var/lib/apt/lists/*
COPY --from=build /out/fenceproxy /usr/local/bin/fenceproxy
USER nobody
EXPOSE 6432 9187
ENTRYPOINT ["fenceproxy"]
CMD ["serve", "--config", "/etc/fenceproxy/fenceproxy.yaml"]
