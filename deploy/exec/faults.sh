#!/bin/sh
# Berth exec backend with fault injection: a wrapper around another step
# script (by default sim-runner.sh beside this file) that, at each step,
# decides from the environment and from a control directory whether to
# misbehave for this attempt. The scenario tests use it to make stops wedge,
# creates fail and runners never register, through the real agent; an
# operator can use it the same way to rehearse a failure on a test host.
#
# Usage (from an agent's config):  create: [sh, deploy/exec/faults.sh, create]
#                                  stop:   [sh, deploy/exec/faults.sh, stop]
#                                  list:   [sh, deploy/exec/faults.sh, list]
# Give each host its own control directory (the list step is not told its host).
#
# Faults. create: fail | hang | no-runner | slow:SECONDS | linger
#           fail       exit 1 and create nothing (an image that is not there)
#           hang       the VM exists but the step does not return until released
#                      (or killed by the agent at its deadline); once released it
#                      goes on and creates (a late create)
#           no-runner  exit 0 with the VM up but no runner started: the runner
#                      never registers
#           slow:N     sleep N seconds (the VM booting), then create
#           linger     create and start the runner, then do not return until
#                      released (or killed at the deadline): a create that
#                      overruns its deadline while its runner takes a job
#         stop:   fail | hang | slow:SECONDS | leak
#           fail       exit 1; the VM stays
#           hang       do not return until released (or killed at the deadline);
#                      once released, stop for real: a LATE stop
#           slow:N     sleep N seconds, then stop
#           leak       exit 0 without stopping: the host keeps counting the VM
#         list:   fail | empty
#           fail       exit 1 (the inventory cannot be read)
#           empty      print nothing (a negative read)
#
# Static selection, from the environment (fixed for the agent's life):
#   BERTH_FAULT_CREATE, BERTH_FAULT_STOP   a fault above, e.g. hang or slow:2
#   BERTH_FAULT_MATCH                      glob on BERTH_ATTEMPT (default *)
#
# Dynamic selection, from the control directory BERTH_FAULT_DIR (optional),
# read at every step, so a test switches faults on and off while the system
# runs. A file named <step>-<fault> (create-fail, create-hang,
# create-no-runner, create-slow, create-linger, stop-fail, stop-hang, stop-slow, stop-leak,
# list-fail, list-empty) holds one attempt glob per line: "*" for every
# attempt, "berth-42-*" for every attempt of job 42; for slow, "GLOB SECONDS";
# for list faults any line will do; lines starting with # are ignored. A
# matching file wins over the environment. The script also writes there:
#   release            create it and every hang returns (and the step goes on)
#   release-<attempt>  create it and that attempt's hangs return
#   calls              one line per step start and end:
#                        <step> start <attempt>
#                        <step> end <attempt> <exit status> <fault or ->
#                      a start without an end is a step still running or killed
#   vms/<attempt>      the host's VM inventory, the backend's truth: made when
#                      a create begins (not for create fail), removed when a
#                      stop succeeds (not for stop leak); holds the runner pid.
#                      The list step prints it, with the wrapped script's list.
#
# BERTH_FAULT_INNER names the wrapped step script; BERTH_FAULT_HANG_MAX (seconds,
# default 600) bounds a hang nobody releases or kills. A hang is a loop of
# short sleeps in the step's process group, so the agent's deadline kill ends it.
set -eu
step="${1:-${BERTH_STEP:?no step given}}"
[ "$step" = list ] || : "${BERTH_ATTEMPT:?BERTH_ATTEMPT is not set: run this from the exec backend}"
attempt="${BERTH_ATTEMPT:-}"
here=$(dirname "$0")
inner="${BERTH_FAULT_INNER:-$here/sim-runner.sh}"
dir="${BERTH_FAULT_DIR:-}"
hang_max="${BERTH_FAULT_HANG_MAX:-600}"

note() {
	[ -n "$dir" ] || return 0
	echo "$*" >>"$dir/calls"
}

# selected FILE: does a line of FILE match this attempt? Sets arg.
selected() {
	[ -n "$dir" ] && [ -f "$1" ] || return 1
	while read -r pat rest || [ -n "${pat:-}" ]; do
		case "${pat:-}" in
		'' | \#*) continue ;;
		esac
		[ "$step" != list ] || pat='*'
		# shellcheck disable=SC2254 # the pattern is a glob on purpose
		case "$attempt" in
		$pat)
			arg="${rest:-}"
			return 0
			;;
		esac
	done <"$1"
	return 1
}

fault="" arg=""
case "$step" in
create) kinds="fail hang no-runner slow linger" static="${BERTH_FAULT_CREATE:-}" ;;
stop) kinds="fail hang slow leak" static="${BERTH_FAULT_STOP:-}" ;;
list) kinds="fail empty" static="" attempt="list" ;;
*) kinds="" static="" ;;
esac
for k in $kinds; do
	if selected "$dir/$step-$k"; then
		fault=$k
		break
	fi
done
if [ -z "$fault" ] && [ -n "$static" ]; then
	# shellcheck disable=SC2254
	case "$attempt" in
	${BERTH_FAULT_MATCH:-*})
		fault="${static%%:*}"
		[ "$fault" = "$static" ] || arg="${static#*:}"
		;;
	esac
fi

vm=""
if [ -n "$dir" ]; then
	vm="$dir/vms/$attempt"
fi

finish() {
	note "$step end $attempt $1 ${fault:--}"
	exit "$1"
}

hang() {
	i=0
	while [ -z "$dir" ] || { [ ! -e "$dir/release" ] && [ ! -e "$dir/release-$attempt" ]; }; do
		if [ "$i" -ge $((hang_max * 10)) ]; then
			echo "faults.sh: $step of $attempt hung for ${hang_max}s and gave up" >&2
			finish 1
		fi
		sleep 0.1
		i=$((i + 1))
	done
}

case "$step" in
list)
	case "$fault" in
	fail)
		echo "faults.sh: list fails (injected)" >&2
		exit 1
		;;
	empty) exit 0 ;;
	esac
	listed=$(sh "$inner" list) # a failed read fails the step
	{
		[ -z "$listed" ] || echo "$listed"
		[ -z "$dir" ] || [ ! -d "$dir/vms" ] || ls "$dir/vms"
	} | sort -u
	exit 0
	;;
esac
note "$step start $attempt"
case "$step" in
create)
	if [ "$fault" = fail ]; then
		echo "faults.sh: create of $attempt fails (injected): image not found" >&2
		finish 1
	fi
	if [ -n "$vm" ]; then
		mkdir -p "$dir/vms"
		: >"$vm"
	fi
	# The attempt's own disk: a late teardown of another attempt must never
	# touch it (law 4).
	[ -z "${BERTH_WORK_DIR:-}" ] || echo "$attempt" >"$BERTH_WORK_DIR/disk.img"
	case "$fault" in
	hang) hang ;;
	no-runner) finish 0 ;;
	slow) sleep "${arg:-1}" ;;
	esac
	status=0
	sh "$inner" create || status=$?
	if [ -n "$vm" ] && [ -f "${BERTH_WORK_DIR:-}/runner.pid" ]; then
		cat "$BERTH_WORK_DIR/runner.pid" >"$vm"
	fi
	[ "$fault" != linger ] || hang
	finish "$status"
	;;
stop)
	case "$fault" in
	fail)
		echo "faults.sh: stop of $attempt fails (injected)" >&2
		finish 1
		;;
	leak) finish 0 ;;
	hang) hang ;;
	slow) sleep "${arg:-1}" ;;
	esac
	status=0
	sh "$inner" stop || status=$?
	if [ "$status" -eq 0 ] && [ -n "$vm" ]; then
		rm -f "$vm"
	fi
	finish "$status"
	;;
*) # assign (a warm VM's runner starts), or a step this wrapper has no faults for
	status=0
	sh "$inner" "$step" || status=$?
	if [ -n "$vm" ] && [ -f "${BERTH_WORK_DIR:-}/runner.pid" ]; then
		cat "$BERTH_WORK_DIR/runner.pid" >"$vm"
	fi
	finish "$status"
	;;
esac
