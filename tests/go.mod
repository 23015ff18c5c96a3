module github.com/berth-ci/berth/tests

go 1.26

require (
	github.com/google/go-github/v62 v62.0.0
	go.uber.org/goleak v1.3.0
)

require github.com/google/go-querystring v1.1.0 // indirect
