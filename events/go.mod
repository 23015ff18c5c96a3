module github.com/berth-ci/berth/events

go 1.26

require pgregory.net/rapid v1.3.0
