# The compose agent and the demo profile's GitHub simulator, built by `make
# images` from static binaries made here: berth, and tests/cmd/ghsim, whose
# `exec` steps run the simulator's runner for the agent's exec backend
# (no shell in a scratch image) and whose `serve` is the simulator.
FROM scratch
COPY berth /berth
COPY ghsim /ghsim
ENTRYPOINT ["/berth"]
