#!/bin/sh
# Berth exec backend for the demo and the tests: the "VM" is a simulated
# GitHub Actions runner process (the ghsim binary's `runner` command) that
# connects to the GitHub simulator with its JIT config, takes one job, runs
# it and exits, as an ephemeral runner does.
#
# Usage (from an agent's config):  create: [sh, deploy/exec/sim-runner.sh, create]
#                                  stop:   [sh, deploy/exec/sim-runner.sh, stop]
#                                  list:   [sh, deploy/exec/sim-runner.sh, list]
#                                  assign: [sh, deploy/exec/sim-runner.sh, assign]
# A warm VM (create with BERTH_WARM=1, no JIT config) is a marker file until
# assign starts its runner with the JIT config.
# Environment: the exec backend's BERTH_* variables, plus BERTH_SIM_RUNNER,
# the path of the ghsim binary.
set -eu

# alive PID: the process exists and is not a zombie (an exited runner whose
# parent is gone may linger unreaped, and kill -0 still succeeds on it).
alive() {
	[ -r "/proc/$1/stat" ] || return 1
	state=$(sed 's/^.*) //' "/proc/$1/stat" | cut -d' ' -f1)
	[ "$state" != Z ]
}

step="${1:-${BERTH_STEP:?no step given}}"
if [ "$step" = list ]; then
	# The inventory: every attempt whose runner process is alive, and every
	# warm VM still waiting for its runner.
	for dir in "${BERTH_ATTEMPTS_DIR:?}"/*/; do
		[ -d "$dir" ] || continue
		if [ -f "$dir/runner.pid" ]; then
			alive "$(cat "$dir/runner.pid")" && basename "$dir"
		elif [ -f "$dir/warm" ]; then
			basename "$dir"
		fi
	done
	exit 0
fi
pidfile="$BERTH_WORK_DIR/runner.pid"
case "$step" in
create | assign)
	if [ "$step" = create ] && [ "${BERTH_WARM:-}" = 1 ]; then
		echo booted >"$BERTH_WORK_DIR/warm" # a warm VM: its runner starts on assign
		exit 0
	fi
	: "${BERTH_SIM_RUNNER:?set BERTH_SIM_RUNNER to the ghsim binary (make demo builds it)}"
	# setsid: the runner outlives this step, in its own process group, so the
	# agent's deadline on this step can never kill it by accident.
	setsid "$BERTH_SIM_RUNNER" runner --jitconfig-file "$BERTH_JIT_CONFIG_FILE" \
		>"$BERTH_WORK_DIR/runner.log" 2>&1 </dev/null &
	echo $! >"$pidfile"
	;;
stop)
	rm -f "$BERTH_WORK_DIR/warm"
	[ -f "$pidfile" ] || exit 0 # nothing was started: already stopped
	pid=$(cat "$pidfile")
	alive "$pid" || exit 0 # the runner finished its job and exited
	kill -TERM "$pid" 2>/dev/null || exit 0
	i=0
	while alive "$pid" && [ "$i" -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	kill -KILL "$pid" 2>/dev/null || true
	;;
*)
	echo "sim-runner.sh: unknown step $step (want create, assign, stop or list)" >&2
	exit 2
	;;
esac
