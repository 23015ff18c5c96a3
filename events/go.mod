module github.com/berth-ci/berth/events

go 1.26

require (
	github.com/goccy/go-json v0.10.5
	pgregory.net/rapid v1.3.0
)
