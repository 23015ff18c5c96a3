#!/bin/sh
# berth-guest: the guest side of Berth's vz backend, run once per boot by
# launchd (ci.berth.guest.plist). It speaks to the agent through the shared
# directory only (services/vmagent/backends/vz/vz.go has the contract):
#
#   guest-ready     written once the share is there and the runner found
#                   (its content: the runner's version)
#   jitconfig       written by the agent: before boot (a cold guest) or on
#                   assign (a warm guest); this script waits for it
#   runner-started  written once run.sh runs (its content: the version)
#   runner-exited   written when the runner ends (its exit status), or when
#                   it cannot start (why)
#   runner.log      the runner's output, as it prints it: the agent reads its
#                   version and GitHub's refusal of an outdated runner there
#
# Every file is written aside and renamed, so the agent never reads half of
# one. The agent's deadlines decide how long anything may take: this script
# waits for the JIT config as long as the guest lives (a warm guest waits
# for its job).
set -u

SHARE="${BERTH_SHARE:-/Volumes/My Shared Files/berth}"
RUNNER_DIR="${BERTH_RUNNER_DIR:-/Users/admin/actions-runner}"
POLL="${BERTH_POLL:-1}"
# How many polls to wait for macOS to mount the share after boot.
MOUNT_POLLS="${BERTH_MOUNT_POLLS:-300}"

log() { printf '%s berth-guest: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }

# put NAME TEXT writes the status file NAME whole.
put() {
	printf '%s\n' "$2" >"$SHARE/.$1.tmp" && mv -f "$SHARE/.$1.tmp" "$SHARE/$1"
}

n=0
while [ ! -d "$SHARE" ]; do
	n=$((n + 1))
	if [ "$n" -gt "$MOUNT_POLLS" ]; then
		log "no shared directory at $SHARE: was this guest booted by berth's vz backend? (it shares the attempt's directory with the macOS automount tag)"
		exit 1
	fi
	sleep "$POLL"
done

if [ ! -x "$RUNNER_DIR/run.sh" ]; then
	put runner-exited "no runner at $RUNNER_DIR/run.sh: install actions/runner there in the base image (docs/macos.md)"
	log "no runner at $RUNNER_DIR/run.sh"
	exit 1
fi
version=$("$RUNNER_DIR/bin/Runner.Listener" --version 2>/dev/null || echo unknown)
put guest-ready "$version"
log "runner $version ready; waiting for the JIT config at $SHARE/jitconfig"

while [ ! -s "$SHARE/jitconfig" ]; do
	sleep "$POLL"
done

cd "$RUNNER_DIR" || exit 1
./run.sh --jitconfig "$(cat "$SHARE/jitconfig")" >"$SHARE/runner.log" 2>&1 &
pid=$!
put runner-started "$version"
log "runner started (pid $pid)"
wait "$pid"
status=$?
put runner-exited "$status"
log "runner exited with status $status"
