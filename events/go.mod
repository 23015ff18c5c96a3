module github.com/berth-ci/berth/events

go 1.26

require pgregory.net/rapid v1.3.0

require github.com/google/btree v1.1.3

require (
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4
	golang.org/x/sys v0.0.0-20211110154304-99a53858aa08 // indirect
)
