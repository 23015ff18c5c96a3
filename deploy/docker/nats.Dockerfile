# nats-server built from its Go module (github.com/nats-io/nats-server/v2)
# by `make images`; no registry is needed.
FROM scratch
COPY nats-server /nats-server
COPY nats.conf /etc/nats/nats.conf
EXPOSE 4222 8222
ENTRYPOINT ["/nats-server", "-c", "/etc/nats/nats.conf"]
