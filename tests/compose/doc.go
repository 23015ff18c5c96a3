// Package compose tests docker-compose.yml with Docker: the default stack's
// config, and the ha profile (a 3-node NATS cluster, two dispatchers, two
// watchdogs) surviving the loss of the node that leads the stream.
//
// The tests need the Docker engine and docker-compose >= 1.28 (or the
// `docker compose` plugin). Without them they skip, or fail when CI is set.
// The ha test builds the images with `make images` first (set
// BERTH_COMPOSE_SKIP_BUILD=1 to use the berth/*:local images as they are),
// brings the profile up under a project name of its own with every host
// port chosen by Docker, and always takes it down again (`down -v`); -short
// skips it.
package compose
