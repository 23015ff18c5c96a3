# Built by `make images` from a static binary made on this machine: no base
# image is pulled.
FROM scratch
COPY berth /berth
ENTRYPOINT ["/berth"]
