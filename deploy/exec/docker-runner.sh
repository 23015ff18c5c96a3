#!/bin/sh
# Berth exec backend for a Linux host with Docker: each attempt runs its
# ephemeral GitHub Actions runner in a container of its own, named by the
# attempt id and labelled with it (law 4: a late stop of one attempt can only
# touch that attempt's container).
#
# Usage (from an agent's config):
#   backend:
#     kind: exec
#     exec:
#       create: [sh, deploy/exec/docker-runner.sh, create]
#       stop:   [sh, deploy/exec/docker-runner.sh, stop]
#       list:   [sh, deploy/exec/docker-runner.sh, list]
#       env:
#         BERTH_DOCKER_IMAGE: my-registry/actions-runner:2.330.0
#
# Environment: the exec backend's BERTH_* variables (see services/vmagent/
# backends/exec), plus, set in the agent's `env`:
#   BERTH_DOCKER_IMAGE       the runner image (required). The default command
#                            fits images built FROM ghcr.io/actions/actions-runner.
#   BERTH_DOCKER_CMD         the command run in the container, split on spaces
#                            (default: sh -c 'exec ./run.sh --jitconfig "$(cat
#                            /berth/jitconfig)"'). The JIT config is mounted
#                            read-only at /berth/jitconfig.
#   BERTH_DOCKER_RUN_ARGS    extra `docker run` arguments, split on spaces
#                            (e.g. "--cpus 2 --memory 4g --network ci").
#   BERTH_DOCKER_STOP_GRACE  seconds the runner gets to exit on SIGTERM before
#                            it is killed (default 10); keep it under the
#                            agent's stop timeout.
#   DOCKER                   the docker CLI (default: docker).
#
# Steps are idempotent: a create retried after a crash finds the container
# it made and succeeds; a stop of a container that is gone succeeds.
set -eu

docker=${DOCKER:-docker}
step="${1:-${BERTH_STEP:?no step given}}"

# exists NAME: a container of that name exists (running or exited).
exists() {
	$docker container inspect --format '{{.Id}}' "$1" >/dev/null 2>&1
}

case "$step" in
list)
	# The inventory: every container this host's agent made, running or not
	# (an exited runner's container still holds its disk until stopped).
	filter="label=berth.attempt"
	$docker container ls --all --filter "$filter" ${BERTH_HOST:+--filter "label=berth.host=$BERTH_HOST"} \
		--format '{{.Label "berth.attempt"}}'
	;;
create)
	: "${BERTH_DOCKER_IMAGE:?set BERTH_DOCKER_IMAGE in the agent's backend.exec.env to the runner image}"
	name="$BERTH_ATTEMPT"
	if exists "$name"; then
		echo "container $name exists already (a retried create): keeping it"
		exit 0
	fi
	# The JIT config file is 0600 for the agent's user; the container's user
	# (the runner image runs as uid 1001) reads a copy that only this
	# attempt's work dir (0700, the agent's) leads to.
	jit="$BERTH_WORK_DIR/jitconfig.container"
	cp "$BERTH_JIT_CONFIG_FILE" "$jit"
	chmod 0644 "$jit"
	if [ -n "${BERTH_DOCKER_CMD:-}" ]; then
		# shellcheck disable=SC2086 # split on purpose
		set -- $BERTH_DOCKER_CMD
	else
		set -- sh -c 'exec ./run.sh --jitconfig "$(cat /berth/jitconfig)"'
	fi
	# shellcheck disable=SC2086 # BERTH_DOCKER_RUN_ARGS is split on purpose
	$docker container run --detach --name "$name" \
		--label "berth.attempt=$BERTH_ATTEMPT" --label "berth.pool=$BERTH_POOL" \
		--label "berth.host=$BERTH_HOST" --label "berth.job=$BERTH_JOB_ID" \
		--mount "type=bind,source=$jit,target=/berth/jitconfig,readonly" \
		${BERTH_DOCKER_RUN_ARGS:-} "$BERTH_DOCKER_IMAGE" "$@" >/dev/null
	;;
stop)
	name="$BERTH_ATTEMPT"
	exists "$name" || exit 0 # never created, or already removed
	$docker container stop --time "${BERTH_DOCKER_STOP_GRACE:-10}" "$name" >/dev/null 2>&1 || true
	if ! $docker container rm --force --volumes "$name" >/dev/null 2>&1; then
		exists "$name" || exit 0 # removed meanwhile (docker run --rm, or a racing stop)
		echo "docker-runner.sh: could not remove container $name; check \`docker ps -a --filter label=berth.attempt=$name\`" >&2
		exit 1
	fi
	;;
*)
	echo "docker-runner.sh: unknown step $step (want create, stop or list)" >&2
	exit 2
	;;
esac
